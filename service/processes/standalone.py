"""``privrelease standalone``: embedded Valkey, one worker and gunicorn, supervised.

The three run as child processes of this one; Ctrl-C (SIGINT) or SIGTERM
stops the API first (no new requests), then the worker (finishing its job),
then Valkey (flushing its AOF). A second start on the same data directory
finds datasets, ledger and releases where they were.

The supervisor binds the API's port itself, before anything starts, and hands
the listening socket to gunicorn: a port another server holds fails at once
with a clear message (and no key is printed), and whatever answers on the port
afterwards is necessarily our gunicorn. A child that exits (Valkey killed or
stopped by an AOF write error, the worker or gunicorn killed) is restarted on
the same data and port after a backoff; one that exits more than
PRIVRELEASE_RESTART_LIMIT times within PRIVRELEASE_RESTART_WINDOW seconds stops
everything, and the supervisor exits non-zero for its own supervisor
(systemd, a container runtime) to act on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import deque
from pathlib import Path
from types import FrameType

from service import apikeys
from service.config import ENV_PREFIX, Config
from service.processes.valkey import EmbeddedValkey
from service.storage import rkeys
from service.storage.dataset_files import DatasetStore

#: first restart delay (seconds); doubled on each restart still inside the window
BACKOFF = 0.5
BACKOFF_MAX = 10.0
#: gunicorn's own default listen backlog
BACKLOG = 2048
#: in the data directory: the operator key ``standalone`` keeps across restarts
BOOTSTRAP_KEY_FILE = "bootstrap-key"


class PortInUse(Exception):
    """The API's address is held by another process (or cannot be bound)."""


class GiveUp(Exception):
    """A child exceeded its restart budget (or could not be restarted)."""


def _say(message: str) -> None:
    """The supervisor's own lines (the children log JSON on the same streams)."""
    print(f"privrelease: {message}", file=sys.stderr, flush=True)


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket on host:port that the API's gunicorn will inherit.

    SO_REUSEADDR (as gunicorn sets) lets a restart bind over TIME_WAIT
    connections, never over a live listener; SO_REUSEPORT is not set, so no
    other process can bind the port beside us.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise PortInUse(f"cannot resolve {host}: {err.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
    except OSError as err:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.set_inheritable(True)
    return sock


class Standalone:
    """Supervises the service's processes until a signal, or a child that keeps dying."""

    def __init__(self, config: Config, host: str, port: int, data_dir: str | None,
                 access_log: bool = False) -> None:
        if data_dir:
            config = dataclasses.replace(config, data_dir=Path(data_dir).resolve())
        self.access_log = access_log
        self.config = config
        self.host, self.port = host, port
        #: worker and API by name, in start order (stopped in reverse)
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.valkey: EmbeddedValkey | None = None
        self.listener: socket.socket | None = None
        self.env: dict[str, str] = {}
        #: when each child was restarted, within the restart window
        self.restarts: dict[str, deque[float]] = {}
        self._stopping = False

    def _start_valkey(self) -> str:
        self.valkey = EmbeddedValkey(self.config.valkey_dir)
        self.valkey.start()
        return self.valkey.url

    def _env(self, url: str) -> dict[str, str]:
        env = dict(os.environ)
        env[ENV_PREFIX + "REDIS_URL"] = url
        env[ENV_PREFIX + "DATA_DIR"] = str(self.config.data_dir)
        env[ENV_PREFIX + "ACCESS_LOG"] = "1" if self.access_log else "0"
        return env

    def _argv(self, name: str) -> list[str]:
        if name == "api":
            assert self.listener is not None
            return ["api", "--host", self.host, "--port", str(self.port),
                    "--fd", str(self.listener.fileno())]
        return [name]

    def _spawn(self, name: str) -> None:
        cmd = [sys.executable, "-m", "service.processes.cli", *self._argv(name)]
        fds = (self.listener.fileno(),) if name == "api" and self.listener else ()
        # own session: a terminal Ctrl-C reaches only us, and we stop them in order
        self.children[name] = subprocess.Popen(cmd, env=self.env, start_new_session=True,
                                               pass_fds=fds)

    def _wait_http(self, timeout: float = 60.0) -> bool:
        """The API answers /healthz (ours: nobody else can listen on our socket)."""
        url = f"http://{self.host}:{self.port}/healthz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping:
            if any(c.poll() is not None for c in self.children.values()):
                return False
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                time.sleep(0.2)
        return False

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def run(self) -> int:
        try:
            self.listener = bind_listener(self.host, self.port)
        except PortInUse as err:
            _say(f"{err}; is another server running there? Stop it or choose --port. "
                 "Nothing was started.")
            return 1
        try:
            self.config.data_dir.mkdir(parents=True, exist_ok=True)
            DatasetStore(self.config.datasets_dir).sweep_tmp()
            url = self.config.redis_url or self._start_valkey()
            client = rkeys.connect(url)
            key_file = self.config.data_dir / BOOTSTRAP_KEY_FILE
            made = False
            if self.config.bootstrap_key:
                apikeys.create(client, "operator", label="bootstrap",
                               token=self.config.bootstrap_key)
            else:
                token, made = apikeys.data_dir_bootstrap(client, key_file)
            self.env = self._env(url)
            signal.signal(signal.SIGINT, self._signal)
            signal.signal(signal.SIGTERM, self._signal)
            self._spawn("worker")
            self._spawn("api")
            if not self._wait_http():
                if self._stopping:  # Ctrl-C while starting
                    return 0
                _say("a process failed to start")
                return 1
            print(f"privrelease API on http://{self.host}:{self.port}", flush=True)
            print(f"data directory: {self.config.data_dir}", flush=True)
            if self.config.bootstrap_key:
                print("operator key: registered from PRIVRELEASE_BOOTSTRAP_KEY", flush=True)
            elif made:
                print(f"operator key (new, also in {key_file}): {token}", flush=True)
            else:
                print(f"operator key: unchanged, in {key_file} (to rotate: revoke it, "
                      "then restart)", flush=True)
            return self._supervise()
        finally:
            self.stop()

    # -- supervision -------------------------------------------------------------------

    def _supervise(self) -> int:
        """Restart what exits, until a signal (0) or a child out of retries (1)."""
        try:
            while not self._stopping:
                if self.valkey is not None and self.valkey.proc is not None \
                        and self.valkey.proc.poll() is not None:
                    self._restart("valkey", self.valkey.proc.returncode)
                for name, child in list(self.children.items()):
                    if child.poll() is not None and not self._stopping:
                        self._restart(name, child.returncode)
                time.sleep(0.2)
        except GiveUp as err:
            _say(f"{err}; stopping everything")
            return 1
        return 0

    def _sleep(self, seconds: float) -> None:
        """A backoff that a stop signal cuts short."""
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0.0)))

    def _restart(self, name: str, code: int | None) -> None:
        """Start ``name`` again after a backoff, or raise GiveUp once its budget is spent."""
        _say(f"{name} exited ({_how(code)})")
        pid = self.valkey.proc.pid if name == "valkey" and self.valkey and self.valkey.proc \
            else self.children[name].pid
        _kill_group(pid)  # what it leaves behind (gunicorn workers, Celery's pool)
        window, limit = self.config.restart_window, self.config.restart_limit
        times = self.restarts.setdefault(name, deque())
        while not self._stopping:
            now = time.monotonic()
            while times and now - times[0] > window:
                times.popleft()
            if len(times) >= limit:
                raise GiveUp(f"{name} exited {len(times) + 1} times within {window:g} s "
                             f"(PRIVRELEASE_RESTART_LIMIT={limit})")
            delay = min(BACKOFF * 2 ** len(times), BACKOFF_MAX)
            _say(f"restarting {name} in {delay:g} s "
                 f"(restart {len(times) + 1} of {limit} within {window:g} s)")
            self._sleep(delay)
            if self._stopping:
                return
            times.append(time.monotonic())
            try:
                if name == "valkey":
                    self._restart_valkey()
                else:
                    self._spawn(name)
            except (RuntimeError, TimeoutError, OSError) as err:
                _say(f"{name} did not start again ({type(err).__name__})")
                continue
            _say(f"{name} restarted")
            return

    def _restart_valkey(self) -> None:
        """The same binary, port and data directory: the AOF brings the ledger back."""
        assert self.valkey is not None
        self.valkey.proc = None
        self.valkey.start()

    def stop(self) -> None:
        """API first, then worker, then Valkey; each gets time to finish."""
        for child in reversed(list(self.children.values())):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            _kill_group(child.pid)
        self.children.clear()
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        print("privrelease stopped", flush=True)


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a child's session (each child leads its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
