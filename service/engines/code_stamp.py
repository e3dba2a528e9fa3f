"""Which code a process runs: the digest the driver and every Spark worker compare.

A Spark worker runs the project's code that its own Python imports (``mechanisms`` and
``service.engines``: the statistics, the row maps, the noise of a partition). A worker
left on another release of the project would compute other partials or draw other noise
than the worker that accounted for them, silently. So each task reports this digest of
the source it imported, and the driver refuses any answer whose digest is not its own
(``SparkEngineError``: the release fails before anything of it is used).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import mechanisms
import service.engines

#: the packages whose code a Spark task runs
PACKAGES = (Path(mechanisms.__file__).parent, Path(service.engines.__file__).parent)


@functools.cache
def stamp() -> str:
    """SHA-256 of the ``.py`` files of ``PACKAGES`` (names and bytes, in name order),
    computed once per process."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            digest.update(f"{package.name}/{path.relative_to(package)}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def check(theirs: str | None) -> None:
    """Refuse an answer computed by other code than this process's."""
    if theirs != stamp():
        from service.engines.spark import SparkEngineError

        raise SparkEngineError(
            "a Spark worker runs other code than this worker (its mechanisms or engine"
            f" digest {str(theirs)[:12]} is not {stamp()[:12]}): install the same"
            " privrelease on the Spark workers")
