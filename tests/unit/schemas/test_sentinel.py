"""The `sentinel://` URL (schemas.sentinel) and what the settings make of it: the
store's URL with every credential, kombu's and Celery's form, the replicas a deadline's
write waits for."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import Settings
from schemas.events import wire_config
from schemas.sentinel import parse_sentinel


def test_a_sentinel_url_names_its_sentinels_master_and_database() -> None:
    address = parse_sentinel("sentinel://u:p%40w@h1:1,h2,[::1]:3/mymaster?db=2")
    assert address.sentinels == (("h1", 1), ("h2", 26379), ("::1", 3))
    assert (address.master, address.db, address.username, address.password) == (
        "mymaster", 2, "u", "p@w",
    )  # fmt: skip
    assert address.public() == "sentinel://h1:1,h2:26379,[::1]:3/mymaster?db=2"
    assert "p@w" not in repr(address)
    assert address.kombu_url() == (
        "sentinel://u:p%40w@h1:1/2;sentinel://u:p%40w@h2:26379/2;sentinel://u:p%40w@[::1]:3/2"
    )


@pytest.mark.parametrize(
    "url",
    [
        "sentinel://h1:1",  # no master
        "sentinel:///m",  # no host
        "sentinel://h1:x/m",
        "sentinel://h1:1/m?db=99",
        "sentinel://h1:1/m?timeout=3",
    ],
)
def test_a_bad_sentinel_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"sentinel|port|db|master|host"):
        parse_sentinel(url)
    with pytest.raises(ValidationError):
        Settings(redis_url=url)


def test_the_settings_add_the_passwords_from_the_secrets_directory(tmp_path: Path) -> None:
    (tmp_path / "redis-password.worker").write_text("wpw")
    (tmp_path / "redis-sentinel-password").write_text("spw")
    settings = Settings(
        redis_url="sentinel://h1:1,h2:2/mm", redis_user="worker", secrets_dir=tmp_path
    )
    address = settings.sentinel_address()
    assert address is not None
    assert (address.username, address.password, address.sentinel_password) == (
        "worker", "wpw", "spw",
    )  # fmt: skip
    assert settings.broker_url() == "sentinel://worker:wpw@h1:1/0;sentinel://worker:wpw@h2:2/0"
    config = wire_config(settings)
    for options in ("broker_transport_options", "result_backend_transport_options"):
        assert config[options]["master_name"] == "mm"
        assert config[options]["sentinel_kwargs"]["password"] == "spw"
    assert config["result_backend"] == config["broker_url"]


def test_a_deadline_s_write_waits_for_a_replica_behind_sentinel_by_default(
    tmp_path: Path,
) -> None:
    assert Settings(redis_url="sentinel://h1:1/mm", secrets_dir=tmp_path).min_replicas == 1
    assert Settings(redis_url="redis://h:6379/0", secrets_dir=tmp_path).min_replicas == 0
    assert Settings(redis_url=None, secrets_dir=tmp_path).min_replicas == 0
    chosen = Settings(redis_url="sentinel://h1:1/mm", redis_min_replicas=0, secrets_dir=tmp_path)
    assert chosen.min_replicas == 0
    assert (
        "master_name"
        not in wire_config(Settings(redis_url=None, secrets_dir=tmp_path))[
            "broker_transport_options"
        ]
    )
