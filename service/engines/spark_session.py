"""One Spark Connect session per process, started on first use (``PRIVRELEASE_SPARK_REMOTE``).

``sc://host:15002`` connects to a Spark Connect server (the cluster does the work; this
process is a thin client). ``local[N]`` starts a Spark Connect server in a local Spark
(a JVM child of this process from the pyspark package, Java 17 from ``PATH`` or
``JAVA_HOME``, a few seconds), for tests and single-host runs. Unlike pyspark's own
``remote("local[N]")`` (always port 15002, so two processes on a host collide), it
listens on a free loopback port with a random token and no web UI, and its Python
workers run this interpreter (``PYSPARK_PYTHON``, unless it is set), so they import the
same packages.

Reaching the server is bounded (``reach``): pyspark retries a server that is away for
over ten minutes (15 tries, backoff up to 60 s), so a worker whose engine is down would
hang on its first call while the release's budget waits. Here a session's retries add up
to about the connect timeout, and a run calls ``reach`` before it marks the data read: an
engine that does not answer in time is a failure before the read, refunded.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pyspark.sql.connect.client.retries import RetryPolicy
    from pyspark.sql.connect.session import SparkSession

#: PRIVRELEASE_SPARK_CONNECT_TIMEOUT's default: seconds to wait for the server to answer
CONNECT_TIMEOUT = 30.0
#: pyspark's first backoff (ms) and its growth, kept; the longest one is cut (see _retries)
_FIRST_BACKOFF_MS, _GROWTH = 50, 4.0


class SparkUnreachable(RuntimeError):
    """The Spark Connect server did not answer within the connect timeout."""


@dataclass(frozen=True)
class _Made:
    pid: int
    session: SparkSession
    #: the local Spark whose Connect server the session talks to (None: a remote one)
    local: Any


_lock = threading.Lock()
#: remote -> the session this process made for it (a forked child makes its own)
_sessions: dict[str, _Made] = {}


def is_local(remote: str) -> bool:
    """Whether ``remote`` asks for a local server (``local``, ``local[N]``, ``local[*]``)."""
    return remote == "local" or remote.startswith("local[")


def engine_name(remote: str | None) -> str:
    """The engine as a release document names it: ``embedded``, ``spark local[N]`` or
    ``spark sc://host:port`` (the URL's parameters, e.g. its token, and any user left out)."""
    if remote is None:
        return "embedded"
    if is_local(remote):
        return f"spark {remote}"
    address = urlsplit(remote.split(";", 1)[0])
    try:
        port = address.port
    except ValueError:  # not a number: the session would not start either
        port = None
    return f"spark sc://{address.hostname or ''}" + (f":{port}" if port else "")


def spark_session(remote: str, connect_timeout: float = CONNECT_TIMEOUT) -> SparkSession:
    """This process's session for ``remote``, started on the first call and reused; a
    server that is away is retried for about ``connect_timeout`` seconds per call (set
    when the session starts), not pyspark's ten minutes."""
    try:
        from pyspark.sql.connect.session import SparkSession
    except ImportError:
        raise RuntimeError("PRIVRELEASE_SPARK_REMOTE needs the Spark Connect client: "
                           "pip install 'privrelease[spark]'") from None

    with _lock:
        made = _sessions.get(remote)
        if made is not None and made.pid == os.getpid() and not made.session.is_stopped:
            return made.session
        if made is not None and made.pid == os.getpid() and made.local is not None:
            made.local.stop()  # its client was closed: a new server, on a new port
        local = None
        url = remote
        if is_local(remote):
            local, url = _start_local(remote)
        session = SparkSession.builder.remote(url).create()  # its own, whatever else is
        session.client.set_retry_policies([_retries(connect_timeout)])
        _sessions[remote] = _Made(os.getpid(), session, local)
        return session


def reach(remote: str, timeout: float = CONNECT_TIMEOUT) -> SparkSession:
    """This process's session for ``remote`` once its server answered a trivial call
    within ``timeout`` seconds; else ``SparkUnreachable``, and the session is closed and
    dropped (the next call starts afresh). A run calls it before it reads any data, so
    an engine that is down fails the release before the read, refunded; the wait depends
    on the setting and the server only, never on the data."""
    session = spark_session(remote, timeout)
    failed: list[BaseException] = []

    def probe() -> None:
        try:  # a configuration read: one small RPC, never a job
            session.conf.get("spark.app.name", None)
        except Exception as err:  # reported below, as the server's refusal
            failed.append(err)

    thread = threading.Thread(target=probe, daemon=True, name="privrelease-spark-probe")
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or failed:
        _drop(remote, session)  # closes the channel: the probe's call ends at once
        why = f"failed ({type(failed[0]).__name__})" if failed else "did not answer"
        raise SparkUnreachable(f"{engine_name(remote)} {why} within {timeout:g} s"
                               ) from (failed[0] if failed else None)
    return session


def _retries(timeout: float) -> RetryPolicy:
    """pyspark's retry policy of a server that is away (UNAVAILABLE), its waits cut to add
    up to at most ``timeout`` seconds: the same first backoff and growth, the longest wait
    a quarter of the timeout (at most pyspark's 60 s), as many tries as fit, no jitter,
    and a delay the server asks for held to the longest wait."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    budget_ms = timeout * 1000
    longest = max(min(60_000, int(budget_ms / 4)), _FIRST_BACKOFF_MS)  # whole ms, as pyspark
    spent, wait, tries = 0, _FIRST_BACKOFF_MS, 0
    while spent + wait <= budget_ms:
        spent, tries = spent + wait, tries + 1
        wait = min(longest, int(wait * _GROWTH))
    return DefaultPolicy(max_retries=tries, initial_backoff=_FIRST_BACKOFF_MS,
                         backoff_multiplier=_GROWTH, max_backoff=longest, jitter=0,
                         max_server_retry_delay=longest)


def _drop(remote: str, session: SparkSession) -> None:
    """Forget ``session`` (if it is still this process's for ``remote``) and close it
    without the release call a stop would send (and retry) to a server that is away."""
    with _lock:
        made = _sessions.get(remote)
        if made is not None and made.session is session:
            del _sessions[remote]
    session.release_session_on_close = False
    session.stop()
    if made is not None and made.session is session and made.local is not None:
        made.local.stop()


def stop(remote: str) -> None:
    """Stop this process's session for ``remote`` (and its local Spark, if it started one)."""
    with _lock:
        made = _sessions.pop(remote, None)
    if made is None or made.pid != os.getpid():
        return
    made.session.stop()
    if made.local is not None:
        made.local.stop()


def _start_local(master: str) -> tuple[Any, str]:
    """A local Spark running a Connect server; its ``sc://`` URL (loopback, token)."""
    from pyspark import SparkConf, SparkContext

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_urlsafe(32)
    # the Connect server starts UDF workers with the JVM's PYSPARK_PYTHON (not the
    # spark.pyspark.python conf); the JVM inherits this process's environment
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = SparkConf().setMaster(master).setAppName("privrelease").setAll([
        ("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin"),
        ("spark.connect.grpc.binding.address", "127.0.0.1"),
        ("spark.connect.grpc.binding.port", str(port)),
        ("spark.connect.authenticate.token", token),
        ("spark.ui.enabled", "false"),
        ("spark.ui.showConsoleProgress", "false"),
    ])
    context = SparkContext(conf=conf)
    context.setLogLevel("ERROR")
    # "localhost": pyspark sends the token over gRPC's local credentials (no TLS)
    return context, f"sc://localhost:{port}/;token={token}"
