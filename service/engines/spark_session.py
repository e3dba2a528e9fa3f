"""One Spark Connect session per process, started on first use (``PRIVRELEASE_SPARK_REMOTE``).

``sc://host:15002`` connects to a Spark Connect server (the cluster does the work; this
process is a thin client). ``local[N]`` starts a local Spark Connect server from the
pyspark package (a JVM child of this process, Java 17 from ``PATH`` or ``JAVA_HOME``,
~8 s), for tests and single-host runs: its Python workers run this interpreter
(``PYSPARK_PYTHON``, unless already set), so they import the same packages.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_lock = threading.Lock()
#: remote -> (the process that made it, its session): a forked child makes its own
_sessions: dict[str, tuple[int, SparkSession]] = {}


def is_local(remote: str) -> bool:
    """Whether ``remote`` asks for a local server (``local``, ``local[N]``, ``local[*]``)."""
    return remote == "local" or remote.startswith("local[")


def spark_session(remote: str) -> SparkSession:
    """This process's session for ``remote``, started on the first call and reused."""
    with _lock:
        made = _sessions.get(remote)
        if made is not None and made[0] == os.getpid():
            return made[1]
        from pyspark.sql import SparkSession

        if is_local(remote):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        session = SparkSession.builder.remote(remote).getOrCreate()
        _sessions[remote] = (os.getpid(), session)
        return session


def stop(remote: str) -> None:
    """Stop this process's session for ``remote`` (and a local server with it)."""
    with _lock:
        made = _sessions.pop(remote, None)
    if made is not None and made[0] == os.getpid():
        made[1].stop()
