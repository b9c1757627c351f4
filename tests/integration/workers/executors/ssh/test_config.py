"""`workers.executors.ssh.config`: destinations parsed and resolved through an
ssh_config (aliases, ProxyJump chains and loops, ProxyCommand), without connecting."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.executors import InvalidArgument
from workers.executors.ssh import resolve_destination


def test_destinations_parse(tmp_path: Path) -> None:
    d = resolve_destination("alice@gpu-1.example:2222", known_hosts=tmp_path / "kh")
    assert (d.user, d.host, d.port) == ("alice", "gpu-1.example", 2222)
    assert d.known_hosts_name == "[gpu-1.example]:2222"
    d = resolve_destination("bob@[::1]:22")
    assert (d.host, d.port, d.known_hosts_name) == ("::1", 22, "::1")
    assert resolve_destination("host", port=2200).port == 2200
    for bad in ["", "a@b@c", "host:99999", "user@", "a b", "host:port"]:
        with pytest.raises(InvalidArgument):
            resolve_destination(bad)


def test_an_ssh_config_alias_resolves(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host gpu\n  HostName 10.1.2.3\n  User trainer\n  Port 2201\n"
        "  IdentityFile ~/keys/gpu\n  ProxyJump bastion\n  ConnectTimeout 7\n"
        "  ServerAliveInterval 20\n  UserKnownHostsFile /etc/kh\n"
        "Host bastion\n  HostName 10.9.9.9\n  User jump\n"
    )
    d = resolve_destination("gpu", ssh_config=config)
    assert (d.host, d.user, d.port, d.alias) == ("10.1.2.3", "trainer", 2201, "gpu")
    assert d.identity_files == (Path("~/keys/gpu").expanduser(),)
    assert d.known_hosts == (Path("/etc/kh"),)
    assert (d.connect_timeout_s, d.keepalive_s) == (7.0, 20.0)
    assert [(j.host, j.user) for j in d.jumps] == [("10.9.9.9", "jump")]


def test_a_proxyjump_loop_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")
    with pytest.raises(InvalidArgument, match="ProxyJump"):
        resolve_destination("a", ssh_config=config)


def test_a_proxycommand_is_expanded_and_never_mixed_with_a_proxyjump(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host via\n  HostName 10.1.2.3\n  User trainer\n  Port 2201\n"
        "  ProxyCommand ssh -W %h:%p %r@bastion\n"
        "Host direct\n  HostName 10.1.2.4\n  ProxyCommand none\n"
        "Host both\n  ProxyJump via\n  ProxyCommand nc %h %p\n"
    )
    via = resolve_destination("via", ssh_config=config)
    assert via.proxy_command == "ssh -W 10.1.2.3:2201 trainer@bastion"
    assert resolve_destination("direct", ssh_config=config).proxy_command is None
    assert resolve_destination("user@host").proxy_command is None
    with pytest.raises(InvalidArgument, match="both ProxyJump and ProxyCommand"):
        resolve_destination("both", ssh_config=config)
