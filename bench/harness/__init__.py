"""The real-service harness the tests and the benchmarks share, plain code (as
fabric ships `fabric/testing`): a redis-server (`redis_server.py`), sshd on
loopback with strict known_hosts and jump chains in network namespaces
(`sshd.py`), the whole service of workers and beat (`pipeline.py`), the fake cloud
metadata servers (`fakecloud.py`) and the notice watcher's environment
(`notice_env.py`), the hostile jobs (`hostile.py`), the chaos campaign
(`chaos.py`), the `run_as` users (`users.py`), a webhook receiver
(`webhook_receiver.py`) and this process's job processes (`processes.py`).

It lives on the top floor (bench/), above the product it drives: the tests import
it from here (their conftests wire it into fixtures), and nothing in `schemas`,
`store`, `producers` or `workers` imports it.
"""
