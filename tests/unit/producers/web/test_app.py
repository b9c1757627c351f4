"""The web view (producers/web/) over a fakeredis-backed store, through FastAPI's
TestClient: auth, escaping, CSRF and confirmation, the actions' tasks, errors, JSON.

The actions publish through `Runwarden._call`; here a subclass records the task and
body instead of sending them, so what the web view asks is checked exactly (the
real publishing is the browser test's: tests/integration/test_web_browser.py)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from producers.api import Runwarden
from producers.web import create_app, make_server
from producers.web.server import is_loopback
from producers.web.text import left_text
from schemas import (
    JobId,
    Preemption,
    RunNotice,
    RunRecord,
    RunState,
    Settings,
    SnapshotReason,
    WatcherState,
)
from schemas.budget import SaveSample, StopBudget, StopTimeouts, TimeoutSource
from schemas.events import TASK_CANCEL, TASK_SNAPSHOT_REQUEST, SnapshotRequestBody
from schemas.preemption import NO_CLIENT
from schemas.text import clean_text as clean
from store import RunStore

USER, PASSWORD = "ops", "s3cret pw:with colon"
AUTH = (USER, PASSWORD)
NOW = datetime.now(UTC).replace(microsecond=0)
JOB = JobId(dir="/work/r1", pid=4242)
HOSTILE = "<script>alert(1)</script>\x1b[31mred\x1b[0m \x1b]0;title\x07\u202eevil\x00end"


class RecordingRunwarden(Runwarden):
    """A Runwarden whose publishing is recorded, answering as a worker would."""

    def __init__(self, store: RunStore) -> None:
        super().__init__(Settings(proof_timeout_s=60, end_timeout_s=30))
        self._store = store
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def _call(self, task: str, body: BaseModel, wait_s: float | None) -> Any:
        data = body.model_dump(mode="json")
        self.sent.append((task, data))
        if task == TASK_SNAPSHOT_REQUEST:
            stop, _ = self.store.stops.open(
                data["run_id"], SnapshotReason(data["reason"]), data["asked_by"], NOW, 60
            )
            return stop.model_dump(mode="json")
        if task == TASK_CANCEL:
            self.store.runs.transition(data["run_id"], RunState.CANCELLED)
            return None
        raise AssertionError(f"unexpected task {task}")


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def api(server: fakeredis.FakeServer) -> Iterator[RecordingRunwarden]:
    client = fakeredis.FakeRedis(server=server)
    yield RecordingRunwarden(RunStore(client))
    client.close()


@pytest.fixture
def client(api: RecordingRunwarden) -> TestClient:
    app = create_app(api, user=USER, password=PASSWORD, flower_url="http://127.0.0.1:5555/")
    return TestClient(app, headers=basic(AUTH), follow_redirects=False)


def basic(auth: tuple[str, str] | None) -> dict[str, str]:
    """The `Authorization` header of `auth` (none for None)."""
    if auth is None:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(":".join(auth).encode()).decode()}


def make_run(
    api: Runwarden, run_id: str, *, created: datetime = NOW, running: bool = True, **fields: Any
) -> RunRecord:
    record = RunRecord(
        id=run_id, target="local", created=created, remote_dir=f"/work/{run_id}", **fields
    )
    assert api.store.runs.create(record)
    if running:
        return api.store.runs.transition(run_id, RunState.RUNNING, job=JOB)
    return record


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def post(client: TestClient, path: str, data: dict[str, str], **headers: str) -> Any:
    return client.post(path, data=data, headers=headers)


# --- auth and headers -------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/stops", "/runs/r1", "/api/runs", "/static/web.js", "/x"])
@pytest.mark.parametrize(
    "auth",
    [None, (USER, "wrong"), ("other", PASSWORD), (USER, PASSWORD[:-1]), (USER.upper(), PASSWORD)],
)
def test_every_path_needs_the_credentials(
    api: RecordingRunwarden, path: str, auth: tuple[str, str] | None
) -> None:
    app = create_app(api, user=USER, password=PASSWORD)
    response = TestClient(app, headers=basic(auth)).get(path)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith('Basic realm="runwarden"')
    assert "content-security-policy" in response.headers


@pytest.mark.parametrize(
    "header",
    [
        "Basic !!!notbase64",
        "Bearer " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(),
        "Basic " + base64.b64encode(USER.encode()).decode(),  # no colon
        "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode() + "x" * 5000,
    ],
)
def test_malformed_authorization_is_refused(api: RecordingRunwarden, header: str) -> None:
    app = create_app(api, user=USER, password=PASSWORD)
    response = TestClient(app).get("/", headers={"Authorization": header})
    assert response.status_code == 401


def test_a_password_with_a_colon_and_the_right_credentials_pass(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["cache-control"] == "no-store"
    assert client.get("/static/web.js").status_code == 200


@pytest.mark.parametrize(("user", "password"), [("", "pw"), ("ops", ""), ("a:b", "pw")])
def test_bad_credentials_configuration_is_refused(
    api: RecordingRunwarden, user: str, password: str
) -> None:
    with pytest.raises(ValueError, match="user"):
        TestClient(create_app(api, user=user, password=password)).get("/")


def test_flower_url_must_be_http(api: RecordingRunwarden) -> None:
    with pytest.raises(ValueError, match="flower_url"):
        create_app(api, user=USER, password=PASSWORD, flower_url="javascript:alert(1)")


# --- pages ------------------------------------------------------------------------


def test_runs_page_lists_runs_newest_first_with_progress(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "old", created=NOW - timedelta(hours=1))
    make_run(api, "new", created=NOW)
    api.store.follow.append_metrics("new", [{"event": "begin", "max_steps": 200},
                                     {"event": "log", "step": 37, "loss": 1.25}])  # fmt: skip
    page = client.get("/").text
    assert page.index('data-run="new"') < page.index('data-run="old"')
    assert '<progress max="200" value="37">' in page
    assert 'data-step="37"' in page
    assert "loss 1.2500" in page
    assert 'data-refresh="2000"' in page
    assert '<a href="/runs/new">new</a>' in page


def test_job_written_text_is_escaped_and_cleaned(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "r1", name=HOSTILE, command=f"echo '{HOSTILE}'")
    api.store.runs.update("r1", lambda r: r.model_copy(update={"message": HOSTILE}))
    api.store.follow.append_log("r1", ["plain line", HOSTILE])
    for path in ("/", "/runs/r1"):
        page = client.get(path).text
        assert "<script>alert" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", page), path
    run_page = client.get("/runs/r1").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;red evilend" in run_page
    lines = client.get("/api/runs/r1/log").json()["lines"]
    assert [line["line"] for line in lines] == [
        "plain line",
        "<script>alert(1)</script>red evilend",
    ]
    # The JSON twin of the record is the record as stored, for scripts.
    assert client.get("/api/runs/r1").json()["message"] == HOSTILE


def test_run_page_shows_the_record_the_open_stop_and_the_history(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "r1", resumed_from="r0")
    before = client.get("/runs/r1").text
    assert 'id="stop-button"' in before
    for reason in SnapshotReason:
        assert f'<option value="{reason}">' in before
    first, _ = api.store.stops.open("r1", SnapshotReason.DISK, "policy:disk", NOW, 60)
    api.store.stops.close("r1", first.stop_id, note="given up <b>now</b>", now=NOW)
    stop, _ = api.store.stops.open("r1", SnapshotReason.COST, "policy:cost", NOW, 600)
    page = client.get("/runs/r1").text
    assert 'data-phase="waiting_proof"' in page
    assert f'data-deadline="{stop.proof_deadline.timestamp()}"' in page
    assert "policy:cost" in page
    assert "given up &lt;b&gt;now&lt;/b&gt;" in page  # the history's note
    assert "policy:disk" in page
    assert '<a href="/runs/r0">r0</a>' in page
    assert 'href="http://127.0.0.1:5555/tasks"' in page
    # A stop in flight: no second Stop offered, Cancel still is.
    assert 'id="stop-button"' not in page
    assert "A stop is in flight" in page
    assert 'id="cancel-button"' in page


def test_run_page_says_what_holds_the_job(api: RecordingRunwarden, client: TestClient) -> None:
    """Whether the job is contained by a cgroup, and whether its target runs it as a
    user of its own, as `show` says it (`producers.boundary`)."""
    api.store.targets.put("local", {"kind": "local", "workdir": "/work"})
    api.store.targets.put("guarded", {"kind": "local", "workdir": "/work", "run_as": "trainer"})
    make_run(api, "plain")
    cgroup = f"/sys/fs/cgroup/runwarden/{'ab' * 16}"
    held_run = RunRecord(id="held", target="guarded", created=NOW, remote_dir="/work/held")
    assert api.store.runs.create(held_run)
    contained = JOB.model_copy(update={"cgroup": cgroup})
    api.store.runs.transition("held", RunState.RUNNING, job=contained)
    plain, held = client.get("/runs/plain").text, client.get("/runs/held").text
    assert re.search(r'id="boundary-contained">no: its processes are known by their group', plain)
    assert "the worker&#39;s own user: not protected against a hostile job" in plain
    yes = f'id="boundary-contained">yes: every process of its job is in the cgroup {cgroup}'
    assert yes in held
    assert 'id="boundary-job-user">trainer: out of reach of the worker' in held
    assert 'id="boundary-' not in client.get("/runs/" + make_run(api, "new", running=False).id).text


def test_run_page_shows_the_preemption_watch_and_its_notice(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "plain")
    assert 'id="preemption"' not in client.get("/runs/plain").text
    watcher = WatcherState(kind="unavailable", text="neither curl nor wget is installed")
    make_run(api, "bare", preemption=Preemption(cloud="aws", watcher=watcher))
    assert NO_CLIENT in client.get("/runs/bare").text
    notice = RunNotice(
        source="azure-preempt",
        seen_at=NOW,
        not_after="Wed, 04 Mar 2026 05:06:37 GMT",  # Azure's form: shown as ISO
        detail=HOSTILE[:60],
        recorded_at=NOW,
    )
    watching = WatcherState(kind="watching", text="azure with curl")
    make_run(api, "r1", preemption=Preemption(cloud="azure", watcher=watching, notice=notice))
    page = client.get("/runs/r1").text
    assert "azure: watching azure with curl" in page
    assert 'id="preemption-notice"' in page
    assert "azure-preempt (&lt;script&gt;" in page
    assert "not after 2026-03-04T05:06:37Z" in page
    assert "&lt;script&gt;" in page
    assert "<script>alert" not in page
    assert "lost-after-notice" not in page
    api.store.runs.transition("r1", RunState.FAILED)  # no snapshot: lost after its notice
    page = client.get("/runs/r1").text
    assert "watched azure with curl until the run ended" in page
    assert (
        f'id="preemption-lost">lost: after the azure-preempt notice seen {NOW:%Y-%m-%d %H:%M:%S}'
        " UTC: the run ended failed before its job proved the preempted snapshot"
    ) in page
    assert 'id="preemption-continued"' not in page  # launched without on_preempt


def test_stops_page_has_live_countdowns(api: RecordingRunwarden, client: TestClient) -> None:
    make_run(api, "r1")
    stop, _ = api.store.stops.open("r1", SnapshotReason.REQUESTED, "cli", NOW, 90)
    ended = api.store.stops.advance(
        "r1", stop.stop_id, stop.phase, stop.phase.WAITING_END,
        end_deadline=NOW + timedelta(seconds=30), note="proof at step 4",
    )  # fmt: skip
    assert ended is not None
    assert ended.end_deadline is not None
    page = client.get("/stops").text
    assert f'data-deadline="{ended.end_deadline.timestamp()}"' in page
    assert "proof seen" in page
    assert "proof at step 4" in page
    assert client.get("/api/stops").json() == [ended.model_dump(mode="json")]
    api.store.stops.close("r1")
    assert "No stop in flight." in client.get("/stops").text


def test_pages_say_which_proof_timeout_a_stop_got_and_why(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "r1")
    learned = StopBudget(proof_timeout_s=8.46, end_timeout_s=30, source=TimeoutSource.LEARNED,
                         why="3 x 2.5 s (the longest of 2 saves) + 1 s")  # fmt: skip
    first, _ = api.store.stops.open("r1", SnapshotReason.DISK, "cli", NOW, 8.46, budget=learned)
    api.store.stops.close("r1", first.stop_id, note="stopped", now=NOW)
    explicit = StopBudget(proof_timeout_s=30, end_timeout_s=30, source=TimeoutSource.EXPLICIT,
                          why="the run's own, 30 s (--proof-timeout)")  # fmt: skip
    api.store.stops.open("r1", SnapshotReason.COST, "cli", NOW, 30, budget=explicit)
    page = client.get("/runs/r1").text
    assert "proof timeout 30 s (explicit): the run&#39;s own, 30 s (--proof-timeout)" in page
    assert "8.5 s, learned" in page  # the history's
    assert 'title="3 x 2.5 s (the longest of 2 saves) + 1 s"' in page
    assert "30.0 s, explicit" in client.get("/stops").text


def test_the_confirmation_says_the_timeouts_the_stop_would_get(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "quick")
    api.store.budgets.record_save("quick", SaveSample(kind="stop", seconds=4, at=NOW))
    make_run(api, "own", timeouts=StopTimeouts(proof_timeout_s=5400, end_timeout_s=90))
    make_run(api, "new")
    token = csrf_of(client.get("/runs/quick").text)
    pages = {r: post(client, f"/runs/{r}/stop", {"csrf": token, "reason": "cost"}).text
             for r in ("quick", "own", "new")}  # fmt: skip
    # Learned: 3 x 4 s + 30 s (floor 60 s): 1 min.
    assert "Without a proof within 1 min 00 s (" in pages["quick"], pages["quick"]
    assert '<span class="budget" title="3 x 4 s (the longest of 1 save) + 30 s, raised to' in (
        pages["quick"]
    )
    assert ">learned</span>" in pages["quick"]
    assert ">explicit</span>" in pages["own"]
    assert "an end within 1 min 30 s" in pages["own"], pages["own"]
    assert ">default</span>" in pages["new"]
    assert api.sent == []


def test_json_twins_are_the_records(api: RecordingRunwarden, client: TestClient) -> None:
    make_run(api, "a", created=NOW - timedelta(seconds=5))
    make_run(api, "b")
    assert client.get("/api/runs").json() == [r.model_dump(mode="json") for r in api.list_runs()]
    assert client.get("/api/runs/a").json() == api.get_run("a").model_dump(mode="json")
    assert client.get("/api/stops").json() == []


# --- errors -----------------------------------------------------------------------


def test_unknown_run_is_404_and_invalid_id_400(client: TestClient) -> None:
    page = client.get("/runs/nope")
    assert page.status_code == 404
    assert "no run &#39;nope&#39;" in page.text
    assert client.get("/api/runs/nope").json() == {"error": "no run 'nope'"}
    assert client.get("/api/runs/nope").status_code == 404
    for bad in ("/runs/Bad_ID", "/runs/-x", "/api/runs/a%20b", "/api/runs/..x/log"):
        response = client.get(bad)
        assert response.status_code == 400, bad
        assert "invalid run id" in response.text
    assert client.get("/no/such/page").status_code == 404


def test_a_bad_log_cursor_is_400(api: RecordingRunwarden, client: TestClient) -> None:
    make_run(api, "r1")
    assert client.get("/api/runs/r1/log", params={"after": "1-2; DROP"}).status_code == 400


def test_a_store_that_is_down_is_503_not_a_trace(
    server: fakeredis.FakeServer, client: TestClient
) -> None:
    server.connected = False
    for path in ("/", "/stops", "/runs/r1", "/api/runs"):
        response = client.get(path)
        assert response.status_code == 503, path
        assert "Traceback" not in response.text


# --- actions ----------------------------------------------------------------------


def test_stop_needs_a_confirmation_then_publishes_the_cli_task(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "r1")
    token = csrf_of(client.get("/runs/r1").text)
    confirm = post(client, "/runs/r1/stop", {"csrf": token, "reason": "cost"})
    assert confirm.status_code == 200
    assert 'name="confirmed" value="yes"' in confirm.text
    assert api.sent == []  # nothing published before the confirmation
    done = post(
        client,
        "/runs/r1/stop",
        {"csrf": csrf_of(confirm.text), "reason": "cost", "confirmed": "yes"},
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/runs/r1?notice=stop"
    # The body the CLI's `runwarden stop` publishes, but asked by the web.
    cli_body = SnapshotRequestBody(run_id="r1", reason=SnapshotReason.COST, asked_by="web")
    assert api.sent == [(TASK_SNAPSHOT_REQUEST, cli_body.model_dump(mode="json"))]
    page = client.get("/runs/r1?notice=stop").text
    assert "Snapshot asked" in page
    assert 'data-phase="waiting_proof"' in page


def test_cancel_needs_a_confirmation_then_publishes_the_cli_task(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "r1")
    token = csrf_of(client.get("/runs/r1").text)
    assert "Confirm cancel" in post(client, "/runs/r1/cancel", {"csrf": token}).text
    assert api.sent == []
    done = post(client, "/runs/r1/cancel", {"csrf": token, "confirmed": "yes"})
    assert done.status_code == 303
    assert api.sent == [(TASK_CANCEL, {"run_id": "r1"})]
    assert api.get_run("r1").state is RunState.CANCELLED


@pytest.mark.parametrize(
    ("headers", "use_token"),
    [
        ({}, False),
        ({"Origin": "http://evil.example"}, True),
        ({"Origin": "null"}, True),
        ({"Referer": "http://evil.example/page"}, True),
        ({"Sec-Fetch-Site": "cross-site"}, True),
        ({"Sec-Fetch-Site": "same-site"}, True),
    ],
)
def test_cross_site_and_tokenless_posts_are_refused(
    api: RecordingRunwarden, client: TestClient, headers: dict[str, str], use_token: bool
) -> None:
    make_run(api, "r1")
    data = {"reason": "requested", "confirmed": "yes"}
    if use_token:
        data["csrf"] = csrf_of(client.get("/runs/r1").text)
    for action in ("stop", "cancel"):
        response = post(client, f"/runs/r1/{action}", data, **headers)
        assert response.status_code == 403, (action, headers)
        assert "refused" in response.text
    assert api.sent == []


def test_a_forged_or_foreign_token_is_refused(api: RecordingRunwarden, client: TestClient) -> None:
    make_run(api, "r1")
    other = create_app(api, user=USER, password=PASSWORD)
    foreign = csrf_of(TestClient(other, headers=basic(AUTH)).get("/runs/r1").text)
    stamp = csrf_of(client.get("/runs/r1").text).split(".")[0]
    for token in (foreign, f"{stamp}.{'0' * 64}", "", "x" * 300):
        data = {"csrf": token, "confirmed": "yes"}
        assert post(client, "/runs/r1/stop", data).status_code == 403
    assert api.sent == []


def test_same_origin_posts_with_the_token_pass(api: RecordingRunwarden, client: TestClient) -> None:
    make_run(api, "r1")
    token = csrf_of(client.get("/runs/r1").text)
    headers = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    response = post(client, "/runs/r1/cancel", {"csrf": token, "confirmed": "yes"}, **headers)
    assert response.status_code == 303


@pytest.mark.parametrize(
    ("prepare", "expected"),
    [
        ("preparing", "has not started a job yet"),
        ("ended", "is not running (it is succeeded)"),
        ("no-snapshots", "cannot save a snapshot"),
    ],
)
def test_refusals_are_shown_on_the_run_page(
    api: RecordingRunwarden, client: TestClient, prepare: str, expected: str
) -> None:
    make_run(api, "r1", running=prepare != "preparing", snapshots=prepare != "no-snapshots")
    token = csrf_of(client.get("/runs/r1").text)  # an open page, then the run ends
    if prepare == "ended":
        api.store.runs.transition("r1", RunState.SUCCEEDED)
    response = post(client, "/runs/r1/stop", {"csrf": token, "confirmed": "yes"})
    assert response.status_code == 409
    assert expected in response.text.replace("&#39;", "'")
    assert 'class="alert error"' in response.text
    assert "Traceback" not in response.text
    assert api.sent == []


def test_bad_forms_are_refused(api: RecordingRunwarden, client: TestClient) -> None:
    make_run(api, "r1")
    token = csrf_of(client.get("/runs/r1").text)
    assert post(client, "/runs/r1/stop", {"csrf": token, "reason": "bored"}).status_code == 400
    big = post(client, "/runs/r1/stop", {"csrf": token, "pad": "x" * 10_000})
    assert big.status_code == 413
    as_json = client.post("/runs/r1/stop", json={"csrf": token, "confirmed": "yes"})
    assert as_json.status_code == 415
    unknown = post(client, "/runs/nope/stop", {"csrf": token})
    assert unknown.status_code == 404
    invalid = post(client, "/runs/Bad/stop", {"csrf": token})
    assert invalid.status_code == 400
    assert client.get("/runs/r1/stop").status_code == 405
    assert api.sent == []


# --- text and serving -------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain\ttab", "plain\ttab"),
        ("\x1b[1;31mbold red\x1b[0m", "bold red"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("a\x1b]0;title\x07b", "ab"),
        ("cursor\x1b[2K\x1b[1Gback", "cursorback"),
        ("\x9b31mc1", "c1"),
        ("bell\x07 nul\x00 del\x7f", "bell nul del"),
        ("two\nlines\r\n", "two lines "),
        ("\u202eesrever\u2066x", "esreverx"),
        ("lone escape\x1b", "lone escape"),
        ("ünïcode ✓", "ünïcode ✓"),
    ],
)
def test_clean(raw: str, shown: str) -> None:
    assert clean(raw) == shown
    assert clean(clean(raw)) == clean(raw)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "in 0 s"),
        (42.4, "in 42 s"),
        (185, "in 3 min 05 s"),
        (7620, "in 2 h 07 min"),
        (-4, "overdue by 4 s"),
        (-61, "overdue by 1 min 01 s"),
    ],
)
def test_left_text(seconds: float, text: str) -> None:
    assert left_text(seconds) == text


def test_serving_anything_but_loopback_must_be_explicit(api: RecordingRunwarden) -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host)
    everywhere = "0.0.0.0"  # noqa: S104 - the refusal is what is tested
    for host in (everywhere, "::", "192.168.1.5", "example.com", ""):
        assert not is_loopback(host)
        with pytest.raises(ValueError, match="allow_remote"):
            make_server(api, host, 0, user=USER, password=PASSWORD)
    server = make_server(api, everywhere, 0, user=USER, password=PASSWORD, allow_remote=True)
    assert server.config.host == everywhere
    with pytest.raises(ValueError, match="port"):
        make_server(api, "127.0.0.1", 70000, user=USER, password=PASSWORD)
