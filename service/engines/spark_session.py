"""One Spark Connect session per process, started on first use (``PRIVRELEASE_SPARK_REMOTE``).

``sc://host:15002`` connects to a Spark Connect server (the cluster does the work; this
process is a thin client). ``local[N]`` starts a Spark Connect server in a local Spark
(a JVM child of this process from the pyspark package, Java 17 from ``PATH`` or
``JAVA_HOME``, a few seconds), for tests and single-host runs. Unlike pyspark's own
``remote("local[N]")`` (always port 15002, so two processes on a host collide), it
listens on a free loopback port with a random token and no web UI, and its Python
workers run this interpreter (``PYSPARK_PYTHON``, unless it is set), so they import the
same packages.
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
    from pyspark.sql.connect.session import SparkSession


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


def spark_session(remote: str) -> SparkSession:
    """This process's session for ``remote``, started on the first call and reused."""
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
        _sessions[remote] = _Made(os.getpid(), session, local)
        return session


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
