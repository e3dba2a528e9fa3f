"""Release documents on disk: run results (and the requests and analysis results the old
Valkey store moved out of its memory) as files beside a release's tables.

Design (issue 19 §3). A release's result (result, accuracy, guarantee) may be a JSON file
in the output store (``<releases_dir>/<release_id>/``) rather than a column of its row
(``Store.results_inline``, ``commit(..., result_stored=True)``). Multi-host: that folder
is on the shared filesystem the datasets are on, and every API process and worker mounts
it at the same path (PRIVRELEASE_DATA_DIR); a reader that finds a file missing answers an
error, never a document without its result.

- ``result.<attempt>.json``: run ``attempt``'s output, written by the worker (atomically:
  temporary file, fsync, link/rename, fsync of the folder) BEFORE it settles. The settle
  records the attempt (``result``) in the same step that checks the run still holds the
  job's lease, so only the attempt recorded by the winning settle is ever read; a run
  that lost its lease removes its own file, and the winner removes the files of runs
  that died (``prune``). A file is never rewritten.
- ``request.<digest>.json``: a request, named by (a prefix of) its SHA-1:
  content-addressed, so any process may write it and its content never differs. The old
  Valkey store moved a settled release's request here and kept the digest (``doc``);
  ``privrelease migrate-from-valkey`` reads them back (``fields``).
- ``analyses/<analysis id>.json``: a succeeded analysis's result (service.analyses).

Retention: documents are kept forever. A consumer paid privacy budget for each result
(deleting it would lose what was bought, and re-asking would spend again), and the audit
events, kept forever too, refer to them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path

from service.storage import room

#: errors of a shared filesystem that has no hard links (some FUSE and SMB mounts)
NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})
PREFLIGHT_BYTES = room.PREFLIGHT_BYTES

#: a release's stored fields that point at files here
REQUEST_DIGEST = "doc"
RESULT_ATTEMPT = "result"


#: hex digits of the SHA-1 a document is named by: it tells apart the versions of one
#: release's request (a collision would need 2^32 versions), in a quarter of the bytes
DIGEST_CHARS = 16


class DocumentMissing(LookupError):
    """A file a release (or analysis) names is not in the output store: the shared folder
    is not mounted here, or was lost. The API answers 503 ``storage_unavailable``
    (``service.api.problems``): the record exists, so 404 would lie and 500 would blame code;
    an operator restores the mount and the client retries. Never a document without it."""


def digest(text: str) -> str:
    """The text's SHA-1 prefix as the scripts compute it (``redis.sha1hex``)."""
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:DIGEST_CHARS]


def _safe(name: str) -> str:
    """A path component from an id we made (release/analysis ids): never a path."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError("not a document id")
    return name


class DocumentStore:
    """JSON documents of releases under ``root`` (the output store's root)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def folder(self, release_id: str) -> Path:
        return self.root / _safe(release_id)

    def _write(self, path: Path, text: str, *, replace: bool) -> bool:
        """Write atomically; without ``replace``, an existing file is kept (False).

        A temporary file of a unique name (two processes may write the same request
        document at once) is written and fsynced, then linked (or renamed) into place,
        then the folder fsynced. The file's fsync makes its content durable before any
        name points at it: a crash never leaves a name on a partial document. The
        folder's fsync makes the name durable: once this returns, the document survives
        a crash, so a ledger step recorded after it (a settle naming the result) never
        names a file a crash lost. Plain ``os`` calls on bytes: no buffered text
        wrapper (its fstat, ioctl and seek) for a write done in one call."""
        if not replace and path.exists():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            try:
                room.write_all(fd, text.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.replace(tmp, path)
            else:
                try:  # link fails if another writer got there first: never rewritten
                    os.link(tmp, path)
                except FileExistsError:
                    return False
                except OSError as err:
                    if err.errno not in NO_HARD_LINKS:
                        raise
                    # a filesystem without hard links: checked above; the one writer of a
                    # run's result, or identical content for a request, so no loss
                    os.replace(tmp, path)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dirfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
        return True

    # -- requests ---------------------------------------------------------------------

    def save_request(self, release_id: str, request_json: str) -> str:
        """Store the request under its digest (idempotent: the same content whoever writes
        it); returns the digest (what the old store's ``doc`` field held)."""
        sha = digest(request_json)
        self._write(self.folder(release_id) / f"request.{sha}.json", request_json,
                    replace=False)
        return sha

    def load_request(self, release_id: str, sha: str) -> str | None:
        path = self.folder(release_id) / f"request.{_safe(sha)}.json"
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    # -- room -------------------------------------------------------------------------

    def check_room(self) -> None:
        """Raise the OSError a write would meet now (``room.check``): cheap enough for
        every POST, which then spends nothing on a store that could not take the
        release's output."""
        self.root.mkdir(parents=True, exist_ok=True)  # a new data directory has none yet
        room.check(self.root, PREFLIGHT_BYTES)

    def preflight(self, release_id: str, attempt: int) -> None:
        """Before a run reads its data: take ``PREFLIGHT_BYTES`` in the release's folder
        and give them back (``room.probe``). A store that cannot take the output (full,
        read-only, gone) then fails the run while it is still refunded, not after the
        read, when the failure rule charges it. The work is the same for every run."""
        folder = self.folder(release_id)
        folder.mkdir(parents=True, exist_ok=True)
        room.probe(folder / f".preflight-{int(attempt)}", PREFLIGHT_BYTES)

    # -- results ----------------------------------------------------------------------

    def save_result(self, release_id: str, attempt: int, output_json: str) -> None:
        """Store run ``attempt``'s output; FileExistsError if that run already stored one
        (a run's output is never replaced)."""
        if not self._write(self._result(release_id, attempt), output_json, replace=False):
            raise FileExistsError("this run already stored its output")

    def load_result(self, release_id: str, attempt: int) -> str | None:
        try:
            return self._result(release_id, attempt).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def discard_result(self, release_id: str, attempt: int) -> None:
        """Remove one run's output (a run that lost the job: its output is not the release's)."""
        with contextlib.suppress(FileNotFoundError):
            self._result(release_id, attempt).unlink()

    def prune(self, release_id: str, keep_result: int | None, keep_request: str | None
              ) -> list[str]:
        """Remove every result file but ``keep_result``'s and every request file but
        ``keep_request``'s (None: remove all of that kind); returns the names removed."""
        folder = self.folder(release_id)
        removed = []
        keep = {f"result.{keep_result}.json" if keep_result is not None else "",
                f"request.{keep_request}.json" if keep_request else ""}
        for path in (folder.glob("*.json") if folder.is_dir() else []):
            if path.name.startswith(("result.", "request.")) and path.name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(path.name)
        return sorted(removed)

    def _result(self, release_id: str, attempt: int) -> Path:
        return self.folder(release_id) / f"result.{int(attempt)}.json"

    # -- analyses ---------------------------------------------------------------------

    def save_analysis(self, release_id: str, analysis_id: str, result_json: str) -> None:
        """Store an analysis's result (an analysis runs once; a re-write is identical)."""
        path = self.folder(release_id) / "analyses" / f"{_safe(analysis_id)}.json"
        self._write(path, result_json, replace=True)

    def load_analysis(self, release_id: str, analysis_id: str) -> str | None:
        path = self.folder(release_id) / "analyses" / f"{_safe(analysis_id)}.json"
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def discard_analysis(self, release_id: str, analysis_id: str) -> None:
        path = self.folder(release_id) / "analyses" / f"{_safe(analysis_id)}.json"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def fields(docs: DocumentStore | None, release_id: str, h: dict[str, str]) -> dict[str, str]:
    """A release's stored fields with ``request`` and ``output`` filled in from disk where
    they are files (fields that hold them are as they are).

    Raises DocumentMissing if the hash points at a file that is missing (the shared folder
    not mounted, or was lost): never a document without its request or result.
    """
    out = dict(h)
    if "request" not in out and REQUEST_DIGEST in out:
        raw = docs.load_request(release_id, out[REQUEST_DIGEST]) if docs else None
        if raw is None:
            raise DocumentMissing("release request missing from the output store")
        out["request"] = raw
    if "output" not in out and RESULT_ATTEMPT in out:
        raw = docs.load_result(release_id, int(out[RESULT_ATTEMPT])) if docs else None
        if raw is None:
            raise DocumentMissing("release result missing from the output store")
        out["output"] = raw
    return out
