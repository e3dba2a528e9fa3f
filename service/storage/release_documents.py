"""Release documents on disk, so Valkey holds per finished release only its index entries,
status and ledger state (~820 B in all once its audit events moved to disk,
service.storage.event_archive; ~2.9 kB before).

Design (issue 19 §3). A release's request (params, the accuracy estimate, the privacy
block) and its result (result, accuracy, guarantee) are JSON files beside its tables in
the output store (``<releases_dir>/<release_id>/``). Multi-host: that folder is on the
shared filesystem the datasets are on, and every API process and worker mounts it at the
same path (PRIVRELEASE_DATA_DIR); a reader that finds a file missing answers an error,
never a document without its result.

- ``result.<attempt>.json``: run ``attempt``'s output, written by the worker (atomically:
  temporary file, fsync, link/rename, fsync of the folder) BEFORE it settles. The settle
  script (settle.lua) records the attempt in the release hash (``result``) in the same
  step that checks the run still holds the job's lease, so only the attempt recorded by
  the winning settle is ever read; a run that lost its lease removes its own file, and the
  winner removes the files of runs that died (``prune``). A file is never rewritten.
- ``request.<digest>.json``: the request as the release hash held it, named by (a prefix
  of) its SHA-1: content-addressed, so any process may write it and its content never
  differs. Whoever settles the release (worker, sweeper, API cancel) writes it first;
  settle.lua drops the hash's ``request`` field and records the digest (``doc``) only if
  the hash's request still has that digest, so a request rewritten meanwhile (a
  ``pricing`` release being priced) is never lost.
- ``analyses/<analysis id>.json``: a succeeded analysis's result (service.analyses).

Valkey keeps the request while the release is pending (the worker, the sweeper and the
pricing job read it there) and, for releases finished before this store existed, until
``privrelease migrate-outputs`` (``migrate``) moves it; readers fall back to the hash's
``request`` and ``output`` fields. Settle also drops the ``replay_key`` pointer (only it
read it) and writes the hash again, so that, every value being at most 64 bytes, Valkey
stores it as a listpack (``hash-max-listpack-value``) rather than a hashtable. Errors
stay in the hash (short). Reading a page of N releases reads N hashes and at most 2 N
files: nothing is loaded that the page does not show.

Retention: documents are kept forever. A consumer paid privacy budget for each result
(deleting it would lose what was bought, and re-asking would spend again), and the audit
events, kept forever too (service.storage.event_archive), refer to them. Per-run state
goes at settle (lease and reservation keys deleted, the replay pointer dropped);
idempotency keys expire (PRIVRELEASE_IDEMPOTENCY_TTL).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from service.storage import room

#: errors of a shared filesystem that has no hard links (some FUSE and SMB mounts)
NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})
PREFLIGHT_BYTES = room.PREFLIGHT_BYTES

#: the release hash's fields that point at files here
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
        it); returns the digest settle.lua checks against the hash's request."""
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


def prune_swept(client: redis.Redis, docs: DocumentStore, release_id: str) -> list[str]:
    """After the sweeper settled a job whose runs died: no run's result is the release's
    (they never committed), and only the request copy the hash names stays. For
    ``service.releases.sweeper.sweep``, beside its ``outputs.prune(release_id, keep=None)``."""
    from service.storage import rkeys

    keep = client.hget(rkeys.release(release_id), REQUEST_DIGEST)
    return docs.prune(release_id, keep_result=None, keep_request=keep)


def fields(docs: DocumentStore | None, release_id: str, h: dict[str, str]) -> dict[str, str]:
    """The release hash with ``request`` and ``output`` filled in from disk where they
    moved there (a hash still holding them, pending or not yet migrated, is as it is).

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


def request_of(docs: DocumentStore | None, release_id: str,
               h: dict[str, str]) -> dict[str, Any] | None:
    """The release's request (from the hash or from disk), or None without one; reads
    no result. ``h`` needs only the ``request`` and ``doc`` fields."""
    raw = h.get("request")
    if raw is None and h.get(REQUEST_DIGEST):
        raw = docs.load_request(release_id, h[REQUEST_DIGEST]) if docs else None
        if raw is None:
            raise DocumentMissing("release request missing from the output store")
    return None if raw is None else dict(json.loads(raw))


#: statuses after which a release's hash changes no more (its documents may move)
FINISHED = frozenset({"succeeded", "failed", "cancelled", "refused"})

# KEYS[1] the release hash. ARGV: 1 digest of the request moved ('' none), 2 of the output
# moved ('' none), 3 attempt naming the moved output (digest: ``digest``).
# (the dataset id is not kept: the release indexes, built before, are what need it)
# Drops what moved only if the hash still holds exactly that (compare-and-set): 1 if it did.
_MOVE_RELEASE = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'succeeded' and status ~= 'failed' and status ~= 'cancelled'
   and status ~= 'refused' then return 0 end
local req = redis.call('HGET', KEYS[1], 'request')
local out = redis.call('HGET', KEYS[1], 'output')
local function d(text) return string.sub(redis.sha1hex(text), 1, 16) end
if ARGV[1] ~= '' and not (req and d(req) == ARGV[1]) then return 0 end
if ARGV[2] ~= '' and not (out and d(out) == ARGV[2]) then return 0 end
if ARGV[1] ~= '' then
  redis.call('HDEL', KEYS[1], 'request')
  redis.call('HSET', KEYS[1], 'doc', ARGV[1])
end
if ARGV[2] ~= '' then
  redis.call('HDEL', KEYS[1], 'output')
  redis.call('HSET', KEYS[1], 'result', ARGV[3])
end
redis.call('HDEL', KEYS[1], 'replay_key')
if redis.call('HEXISTS', KEYS[1], 'request') == 0 and redis.call('HEXISTS', KEYS[1], 'output') == 0
   then  -- written again: a listpack once every value is short (settle.lua does the same)
  local all = redis.call('HGETALL', KEYS[1])
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(all))
end
return 1
"""

# KEYS[1] the analysis hash. ARGV: 1 SHA-1 of the result moved. Compare-and-set as above.
_MOVE_ANALYSIS = """
local res = redis.call('HGET', KEYS[1], 'result')
if redis.call('HGET', KEYS[1], 'status') ~= 'succeeded' or not res
   or string.sub(redis.sha1hex(res), 1, 16) ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'result')
redis.call('HSET', KEYS[1], 'stored', '1')
return 1
"""

#: the attempt number a migrated output is filed under (runs are numbered from 1)
MIGRATED_ATTEMPT = 0


@dataclass
class Migration:
    """What ``migrate`` moved: releases whose documents left Valkey, analyses likewise,
    and releases left as they were (pending, or changed while being moved: run again)."""

    releases: int = 0
    analyses: int = 0
    skipped: int = 0


def migrate(client: redis.Redis, docs: DocumentStore, batch: int = 500) -> Migration:
    """Move the request and output of every finished release, and the result of every
    succeeded analysis, still held in Valkey into ``docs`` (``privrelease
    migrate-outputs``). Files first (fsynced), then a compare-and-set that drops the
    Valkey copy only if it is still what was written: safe while the service runs, and
    to run again (a second run finds nothing to move)."""
    from service.storage import index, rkeys

    done = Migration()
    # the list indexes first: releases made before them are found by the dataset id in
    # their request, which is about to leave the hash
    index.ensure_release_indexes(client, docs)
    move_release = client.register_script(_MOVE_RELEASE)
    move_analysis = client.register_script(_MOVE_ANALYSIS)
    start = 0
    while ids := client.zrange(rkeys.RELEASES, start, start + batch - 1):
        start += batch
        pipe = client.pipeline(transaction=False)
        for release_id in ids:
            pipe.hgetall(rkeys.release(release_id))
        for release_id, h in zip(ids, pipe.execute(), strict=True):
            if not h or ("request" not in h and "output" not in h):
                continue
            if h.get("status") not in FINISHED:
                done.skipped += 1
                continue
            req_sha = out_sha = ""
            if "request" in h:
                req_sha = docs.save_request(release_id, h["request"])
            if "output" in h:
                out_sha = digest(h["output"])
                path = docs._result(release_id, MIGRATED_ATTEMPT)
                if docs.load_result(release_id, MIGRATED_ATTEMPT) != h["output"]:
                    docs._write(path, h["output"], replace=True)
            moved = move_release(keys=[rkeys.release(release_id)],
                                 args=[req_sha, out_sha, MIGRATED_ATTEMPT])
            if int(moved):
                done.releases += 1
            else:
                done.skipped += 1
    for key in client.scan_iter(rkeys.analysis("*"), count=batch):
        if key.count(":") != 2:  # pr:ana:<id> only
            continue
        h = client.hgetall(key)
        if h.get("status") != "succeeded" or "result" not in h:
            continue
        analysis_id = key.rsplit(":", 1)[1]
        docs.save_analysis(h["release_id"], analysis_id, h["result"])
        if int(move_analysis(keys=[key], args=[digest(h["result"])])):
            done.analyses += 1
    return done
