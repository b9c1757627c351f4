# The two commands of the README's quick start: `make demo` and `make test`.
# Both install what they need: Debian packages through apt-get (as root), Python
# packages into .venv.

VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := redis-server redis-sentinel openssh-server openssh-client busybox procps tar coreutils findutils iproute2 docker-compose chromium curl wget sudo util-linux passwd shellcheck slurmctld slurmd slurm-client munge
PYTEST_ARGS ?=
# pytest-xdist processes: the integration tests mostly wait (on services, jobs, SSH),
# so more processes than cores pay; files are the unit of distribution, so a module's
# shared services start once (docs/development.md).
TEST_WORKERS ?= 5

.PHONY: demo test suite check check-ruff check-mypy check-unit check-sh lint lock system-deps venv clean

# Everything the tests use (every extra), at the versions of requirements-dev.lock.
$(VENV)/.installed: pyproject.toml requirements-dev.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements-dev.lock -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# Re-resolves `.[dev]` (pyproject.toml) into requirements-dev.lock; installs nothing.
lock: venv
	$(PY) .ci/lock.py > requirements-dev.lock.new
	mv requirements-dev.lock.new requirements-dev.lock

# Installs the Debian packages the tests need when any is missing (root only; else
# it names them and stops).
system-deps:
	@if command -v redis-server >/dev/null && [ -x /usr/sbin/sshd ] && command -v busybox >/dev/null \
	    && command -v ps >/dev/null && command -v ssh-keygen >/dev/null && command -v ip >/dev/null && command -v docker-compose >/dev/null \
	    && [ -x /usr/bin/chromium ] && command -v curl >/dev/null && command -v wget >/dev/null \
	    && command -v sudo >/dev/null && command -v setpriv >/dev/null && command -v useradd >/dev/null \
	    && command -v shellcheck >/dev/null && command -v sbatch >/dev/null \
	    && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "installing $(APT_PACKAGES)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	else echo "please install: $(APT_PACKAGES)" >&2; exit 1; fi

# The on-target scripts (workers/executors/sh/) are POSIX sh: dash and busybox run them.
lint: venv check-sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy schemas store producers workers bench

check-sh:
	shellcheck -s sh workers/executors/sh/*.sh

# The linters and the suite at once (the suite leaves a core idle a fifth of its time);
# either failing fails the run.
test: system-deps venv
	@$(MAKE) --no-print-directory -j2 lint suite

# pytest runs under a subreaper: orphaned job processes are reaped even where this
# machine's init does not reap them (a zombie counts as a live group member). Bytecode is
# written even where PYTHONDONTWRITEBYTECODE is set: every pytest-xdist process collects
# every test module, and pytest caches its assertion rewriting only as bytecode (12 -> 7 s
# of CPU a process); the processes the tests start compile the repository once, not each.
suite: venv
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m workers.reaper -- $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Everyday check: ruff, mypy, shellcheck and the unit tests (tests/unit: no process, no server
# but the session's redis-server) at once.
check: venv
	@$(MAKE) --no-print-directory -j3 -O check-ruff check-mypy check-unit check-sh

check-ruff:
	$(VENV)/bin/ruff check .

check-mypy:
	$(VENV)/bin/mypy schemas store producers workers bench

check-unit:
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m workers.reaper -- $(PY) -m pytest -q -n 2 --dist loadfile tests/unit $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/runwarden demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
