"""``privrelease standalone``: embedded PostgreSQL and Valkey, one worker and gunicorn,
supervised.

The four run as child processes of this one. PostgreSQL starts first and its schema is
upgraded (``service.storage.database.upgrade``) before anything that uses it starts;
with PRIVRELEASE_DATABASE_URL set, that server is used and only upgraded, and with
PRIVRELEASE_REDIS_URL set, no Valkey is started either. Ctrl-C (SIGINT) or SIGTERM
stops the API first (no new requests), then the worker (finishing its job), then Valkey
(flushing its AOF), then PostgreSQL (a checkpoint). A second start on the same data
directory finds datasets, ledger and releases where they were.

The supervisor binds the API's port itself, before anything starts, and hands
the listening socket to gunicorn: a port another server holds fails at once
with a clear message (and no key is printed), and whatever answers on the port
afterwards is necessarily our gunicorn. A child that exits (Valkey killed or
stopped by an AOF write error, the worker or gunicorn killed) is restarted on
the same data and port after a backoff (PostgreSQL killed: on the same cluster and
socket, so the URL the others hold stays right); one that exits more than
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

import redis

from service import apikeys, policy, wiring
from service.config import ENV_PREFIX, Config
from service.processes import schema
from service.processes.postgres import EmbeddedPostgres
from service.processes.valkey import EmbeddedValkey
from service.storage import database, objects, rkeys, valkey_migration
from service.storage.dataset_files import DatasetStore
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.valkey_store import ValkeyRecord

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


class NoDatabase(Exception):
    """PostgreSQL could not be started, reached or upgraded."""


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
        #: the embedded servers by name, in start order (stopped in reverse, after the rest)
        self.servers: dict[str, EmbeddedPostgres | EmbeddedValkey] = {}
        self.listener: socket.socket | None = None
        self.env: dict[str, str] = {}
        #: when each child was restarted, within the restart window
        self.restarts: dict[str, deque[float]] = {}
        self._stopping = False
        #: what the banner says of the database, once it is up
        self.database_line = ""

    def _start_valkey(self) -> str:
        valkey = self.servers["valkey"] = EmbeddedValkey(self.config.valkey_dir)
        valkey.start()
        return valkey.url

    def _database(self) -> str:
        """PRIVRELEASE_DATABASE_URL's server, or our own started; either one's schema
        brought to the newest revision before anything that uses it starts."""
        url = self.config.database_url
        if url is None:
            postgres = self.servers["postgres"] = EmbeddedPostgres(self.config.postgres_dir)
            try:
                postgres.start()
            except (RuntimeError, TimeoutError, OSError) as err:
                raise NoDatabase(f"the embedded PostgreSQL did not start: {err}") from None
            url = postgres.url
        try:
            database.upgrade(url)
            revision = schema.current(url)
        except schema.FAILURES as err:
            raise NoDatabase(f"cannot upgrade the database {schema.redacted(url)}: "
                             f"{schema.reason(err)}") from None
        where = schema.redacted(url) if self.config.database_url else f"{url} (embedded)"
        self.database_line = f"PostgreSQL: {where}, schema at {schema.describe(revision)}"
        return url

    def _move_valkey_record(self, client: redis.Redis, database_url: str) -> None:
        """A data directory from before PostgreSQL: its record (datasets, ledgers,
        releases, events, API keys, console sessions, analyses) moved into the database
        now, before the API and workers start
        (``service.storage.valkey_migration``); once, then marked in Valkey."""
        if not valkey_migration.pending(client):
            return
        docs = DocumentStore(self.config.releases_dir)
        source = ValkeyRecord(client, docs, self.config.audit_dir)
        pool = database.connect(database_url)
        try:
            target = PgLedger(pool, self.config.lease_seconds, documents=docs)
            done = valkey_migration.migrate(source, target)
            policy.migrate(target, done.datasets)  # as the old processes did at start-up
        finally:
            pool.close()
        _say(f"moved the Valkey record into PostgreSQL: {len(done.datasets)} dataset(s),"
             f" {done.releases} release(s), {done.events} audit event(s),"
             f" {done.keys} API key(s), {done.analyses} analys(es)")

    def _env(self, url: str, database_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env[ENV_PREFIX + "REDIS_URL"] = url
        env[ENV_PREFIX + "DATABASE_URL"] = database_url
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
            DatasetStore(objects.from_config(self.config),
                         staging_dir=self.config.staging_dir).sweep_tmp()
            try:
                database_url = self._database()
            except NoDatabase as err:
                _say(f"{err}. Nothing else was started.")
                return 1
            url = self.config.redis_url or self._start_valkey()
            client = rkeys.connect(url)
            self._move_valkey_record(client, database_url)
            key_file = self.config.data_dir / BOOTSTRAP_KEY_FILE
            made = False
            with wiring.key_store(dataclasses.replace(
                    self.config, redis_url=url, database_url=database_url)) as keys:
                if self.config.bootstrap_key:
                    apikeys.create(keys, "operator", label="bootstrap",
                                   token=self.config.bootstrap_key)
                else:
                    token, made = apikeys.data_dir_bootstrap(keys, key_file)
            self.env = self._env(url, database_url)
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
            print(self.database_line, flush=True)
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
                for name, server in list(self.servers.items()):
                    if server.proc is not None and server.proc.poll() is not None:
                        self._restart(name, server.proc.returncode)
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
        server = self.servers.get(name)
        pid = server.proc.pid if server is not None and server.proc is not None \
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
                if server is not None:
                    self._restart_server(server)
                else:
                    self._spawn(name)
            except (RuntimeError, TimeoutError, OSError) as err:
                _say(f"{name} did not start again ({type(err).__name__})")
                continue
            _say(f"{name} restarted")
            return

    @staticmethod
    def _restart_server(server: EmbeddedPostgres | EmbeddedValkey) -> None:
        """The same binary, address and data directory: Valkey's AOF brings the ledger
        back, PostgreSQL's WAL its last commits."""
        server.proc = None
        server.start()

    def stop(self) -> None:
        """API first, then worker, then Valkey, then PostgreSQL; each gets time to finish."""
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
        for server in reversed(list(self.servers.values())):
            server.stop()
        self.servers.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        print("privrelease stopped", flush=True)


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a child's session (each child leads its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
