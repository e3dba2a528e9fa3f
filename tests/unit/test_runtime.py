"""The supervisor's pieces that need no running service: its settings and its socket."""

from __future__ import annotations

import signal
import socket

import pytest

from service.config import Config
from service.processes.standalone import PortInUse, _how, bind_listener


def test_restart_and_header_settings_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVRELEASE_HEADER_TIMEOUT", "2.5")
    monkeypatch.setenv("PRIVRELEASE_RESTART_LIMIT", "7")
    monkeypatch.setenv("PRIVRELEASE_RESTART_WINDOW", "30")
    config = Config.from_env()
    assert (config.header_timeout, config.restart_limit, config.restart_window) == (2.5, 7, 30)
    # 0, negative, infinite or not a number would switch the protection off: refused
    for bad in ("0", "-1", "inf", "nan", "soon"):
        monkeypatch.setenv("PRIVRELEASE_HEADER_TIMEOUT", bad)
        with pytest.raises(SystemExit, match="PRIVRELEASE_HEADER_TIMEOUT"):
            Config.from_env()


def test_listener_refuses_a_held_port_and_is_exclusive() -> None:
    """A port another process listens on fails at bind time, before anything starts
    (the old supervisor let gunicorn fail later and trusted any 200 on the port)."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(PortInUse, match=f"127.0.0.1:{port}"):
            bind_listener("127.0.0.1", port)
    ours = bind_listener("127.0.0.1", 0)
    try:
        assert ours.get_inheritable()  # gunicorn inherits it
        with pytest.raises(PortInUse):  # and nobody binds beside us (no SO_REUSEPORT)
            bind_listener("127.0.0.1", ours.getsockname()[1])
    finally:
        ours.close()


def test_exit_described() -> None:
    assert _how(-signal.SIGKILL) == "killed by SIGKILL"
    assert _how(3) == "exit status 3"
