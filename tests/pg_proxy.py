"""A PostgreSQL whose COMMIT's reply is lost: a proxy between a client and the server that
forwards a COMMIT, lets the server commit it, and drops the reply (the case of a primary
that died right after its commit replicated, or a network that broke then).

``ReplyDropper`` is the proxy (a Unix socket in a directory of its own); ``lossy_database``
makes a database on a running server (the session's ``postgres_url``), migrated, reached
through a proxy: the tests of ``PgLedger``'s re-runs (tests/integration/test_pg_ledger.py,
tests/e2e/test_pg_failover.py) use it.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg

from service.storage import database
from tests.conftest import database_on

#: the simple-query COMMIT psycopg sends (``Connection.commit``): 'Q', length 11, the text
COMMIT_MESSAGE = b"Q\x00\x00\x00\x0bCOMMIT\x00"
#: the extended protocol's Sync: the end of a statement sent with parameters; outside a
#: transaction block (autocommit) the statement's implicit transaction commits there
SYNC_MESSAGE = b"S\x00\x00\x00\x04"
#: ReadyForQuery and its length; the byte after it is the session's state ('I': idle)
READY_MESSAGE = b"Z\x00\x00\x00\x05"


class ReplyDropper:
    """A Unix-socket proxy to a PostgreSQL server that, once armed, forwards the next
    message that ends a transaction (a COMMIT, or a statement sent outside a transaction
    block: its Sync while the session is idle), waits for the server's reply (the commit
    is done), drops it and breaks the connection: the client never learns that its
    transaction committed."""

    def __init__(self, upstream: str, directory: Path, port: int) -> None:
        self.upstream = upstream
        self.path = directory / f".s.PGSQL.{port}"
        self.directory, self.port = directory, port
        self.armed = threading.Event()
        self.dropped = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.path))
        self.server.listen(16)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def conninfo(self) -> str:
        return (f"host={self.directory} port={self.port} user=postgres dbname=postgres "
                "sslmode=disable gssencmode=disable")

    def close(self) -> None:
        self.closed = True
        self.server.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        dropping = threading.Event()
        idle = [True]  # the session's state at the server's last ReadyForQuery

        def replies() -> None:
            with contextlib.suppress(OSError):
                while chunk := upstream.recv(65536):
                    if dropping.is_set():  # the commit's reply: the commit happened
                        self.dropped += 1
                        break
                    at = chunk.rfind(READY_MESSAGE)
                    if at >= 0 and at + 5 < len(chunk):
                        idle[0] = chunk[at + 5:at + 6] == b"I"
                    client.sendall(chunk)
            for end in (client, upstream):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

        threading.Thread(target=replies, daemon=True).start()
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                ends = COMMIT_MESSAGE in chunk or (idle[0] and chunk.endswith(SYNC_MESSAGE))
                if ends and self.armed.is_set():
                    self.armed.clear()
                    dropping.set()
                upstream.sendall(chunk)


def socket_of(url: str) -> str:
    """The Unix socket path of the server of a ``postgresql://...?host=dir`` URL."""
    with psycopg.connect(url) as conn:
        info = conn.info
        return f"{info.host}/.s.PGSQL.{info.port}"


@contextlib.contextmanager
def lossy_database(server_url: str) -> Iterator[tuple[str, ReplyDropper]]:
    """A new database on the server of ``server_url``, migrated to head through a
    ``ReplyDropper``: (the conninfo that reaches it through the proxy, the proxy).
    Dropped (with the proxy) at the end."""
    name = "lossy_" + secrets.token_hex(4)
    database_on(server_url, name)
    directory = Path(tempfile.mkdtemp(prefix="pgd", dir="/tmp"))
    proxy = ReplyDropper(socket_of(server_url), directory, 5432)
    try:
        database.upgrade(f"postgresql://postgres@/{name}?host={directory}&port=5432")
        yield proxy.conninfo.replace("dbname=postgres", f"dbname={name}"), proxy
    finally:
        proxy.close()
        with contextlib.suppress(OSError):
            proxy.path.unlink()
            directory.rmdir()
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
