"""Dataset versions registered by reference to Parquet already in storage (issue #30.2).

An operator names a storage URL (``s3://bucket/prefix-or-key``, read with the service's
S3 endpoint and credentials, or ``file:///abs/dir-or-file``) instead of uploading a file
through HTTP. The service scans it once, in bounded memory, with the upload's own Parquet
validation (``ingest.iter_parquet``: the same checks and messages, prefixed with the
object's key), and writes what it read into a normal stored version
(``DatasetStore.staging``).

Why the data is copied rather than read in place: releases read one canonical format
(positional column names, category codes, plain pages, no footer statistics: no minimum
or maximum of the data in a footer), whichever engine reads it (the worker, Spark); and
a version must be immutable, which objects the operator can still write are not. Each
object is pinned as it was read (key, size, ETag, and the version id where the bucket
keeps versions): HEAD before and after reading it, and a change in between refuses the
registration (409 ``source_changed``, nothing stored). A later change to the source
objects cannot affect a release (releases read the copy); registering the changed
source again makes a new version. The version's manifest keeps every pin
(``record``); its document a summary (``summary``: counts and a digest of the pins).

What may be read: only sources under a root the operator configured
(``PRIVRELEASE_SOURCE_ROOTS``; none: registering by reference is off), so a request
cannot make the service read arbitrary files or buckets. A path is checked once it is
normalised: ``.`` and ``..`` segments are refused outright, a ``file://`` path is
resolved (symlinks followed) before the root check, and a symbolic link inside a source
folder is refused, not followed: its files are stat'ed with ``lstat`` and opened with
``O_NOFOLLOW``, the opened file checked to lie under the folder (``_Confined``), so a
file or folder swapped for a link after the listing is refused as changed.

A URL whose last segment ends in ``.parquet`` names one object; any other names a folder
(prefix): every ``*.parquet`` object under it, in key order. Names of which a segment
starts with ``_`` or ``.`` (``_SUCCESS``, ``.crc`` checksums: hidden by the convention of
Hadoop, Spark and ``pyarrow.dataset``) are skipped, and listed: in the answer's
``warnings`` and the manifest. Any other object refuses the source (422
``source_invalid``), as does a listing of more than ``PRIVRELEASE_MAX_SOURCE_FILES``
objects. Messages name keys and URLs, never values.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.ingest import DatasetSpec, IngestError, iter_parquet
from service.storage.objects import (
    LocalStore,
    NotFound,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    Unavailable,
    check_key,
    from_url,
)

SUFFIX = ".parquet"
#: hidden names skipped in a folder (a segment starting with one of these)
HIDDEN = ("_", ".")
#: skipped names a warning quotes (the manifest keeps them all)
WARN_NAMES = 20


class SourceError(Exception):
    """A source refused: ``status`` (403, 409, 422), ``code``, a message naming keys and
    URLs only, and the request ``field``."""

    def __init__(self, status: int, code: str, message: str, field: str = "source") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def _invalid(message: str) -> SourceError:
    return SourceError(422, "source_invalid", message)


@dataclass(frozen=True)
class Source:
    """A resolved source: the store rooted at its folder (or the folder of its one
    object) and the keys to read, in order; ``skipped``, hidden names left out."""

    url: str
    store: ObjectStore
    keys: list[str]
    skipped: list[str]


# -- where a source may be ------------------------------------------------------------


def _segments(path: str) -> list[str]:
    """The ``/``-separated segments of a source path, refusing ``.``/``..``/empty ones."""
    parts = [p for p in path.strip("/").split("/")] if path.strip("/") else []
    if any(p in {"", ".", ".."} for p in parts):
        raise _invalid("a source path must not hold '.', '..' or empty segments")
    return parts


def _parse(url: str) -> tuple[str, str, str]:
    """(scheme, bucket or '', path) of a ``file://`` or ``s3://`` URL, checked."""
    if not isinstance(url, str) or not url:
        raise _invalid("source must be a storage URL (file:///path or s3://bucket/key)")
    parts = urlsplit(url)
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise _invalid("a source URL has no query, fragment or credentials")
    if parts.scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in {"", "localhost"} or not path.startswith("/"):
            raise _invalid("a file:// source must be file:///absolute/path")
        _segments(path)
        return "file", "", path
    if parts.scheme == "s3":
        if not parts.netloc:
            raise _invalid("an s3:// source must name a bucket (s3://bucket/key)")
        return "s3", parts.netloc, "/".join(_segments(unquote(parts.path)))
    raise _invalid("a source URL must start with file:// or s3://")


def _within(path: str, root: str) -> bool:
    """Whether ``/``-separated ``path`` is ``root`` or under it (whole segments)."""
    return not root or path == root or path.startswith(root.rstrip("/") + "/")


def resolve(url: str, roots: Sequence[str], *, endpoint: str | None,
            max_files: int) -> Source:
    """The source ``url`` names, if it lies under one of ``roots``; SourceError (403
    outside the roots or none configured, 422 malformed, missing or holding other files).
    The root check runs on the normalised path, before anything of the source is read."""
    if not roots:
        raise SourceError(403, "source_not_allowed", "registering by reference is off: the"
                          " server's operator allows it under PRIVRELEASE_SOURCE_ROOTS")
    scheme, bucket, path = _parse(url)
    allowed = False
    for root in roots:
        root_scheme, root_bucket, root_path = _parse(root)
        if root_scheme != scheme or root_bucket != bucket:
            continue
        if scheme == "file":
            real, real_root = os.path.realpath(path), os.path.realpath(root_path)
            allowed = allowed or _within(real, real_root)
        else:
            allowed = allowed or _within(path, root_path)
    if not allowed:
        raise SourceError(403, "source_not_allowed", f"source {url} is not under a source"
                          " root the server allows (PRIVRELEASE_SOURCE_ROOTS)")
    with _reading(url):
        if scheme == "file":
            return _local(url, Path(os.path.realpath(path)), max_files)
        return _s3(url, bucket, path, endpoint, max_files)


@contextlib.contextmanager
def _reading(url: str) -> Iterator[None]:
    """A store's refusal (no such bucket, no permission) as 422 ``source_unreadable``,
    without its text (it names the endpoint); an outage stays ``Unavailable`` (503)."""
    failed = False
    try:
        yield
    except (Unavailable, NotFound):
        raise
    except ObjectStoreError:
        failed = True
    if failed:
        raise SourceError(422, "source_unreadable", f"source {url} cannot be read: the"
                          " store refused (no such bucket, or no permission)")


def _local(url: str, path: Path, max_files: int) -> Source:
    if path.is_file():
        _check_name(path.name, url)
        return Source(url, _Confined(path.parent), [path.name], [])
    if not path.is_dir():
        raise _missing(url)
    unreadable = False
    try:
        keys, skipped = _sorted_keys(_walk(path, "", url), url, max_files)
    except OSError:  # a folder the service may not list (its text names the path)
        unreadable = True
    if unreadable:
        raise SourceError(422, "source_unreadable", f"source {url} cannot be read: a"
                          " folder of it cannot be listed (permissions)")
    return Source(url, _Confined(path), keys, skipped)


class _Confined(LocalStore):
    """A source folder read without following a link: a file is stat'ed with ``lstat``
    and opened with ``O_NOFOLLOW``, and the opened file must be the one stat'ed and lie
    under the folder (``/proc/self/fd`` names it), so a file or folder swapped for a link
    out of the root after the listing is refused as changed, never read."""

    def stat(self, key: str) -> tuple[ObjectInfo, str | None]:
        try:
            st = os.lstat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object {key} in {self.url}") from None
        if not stat.S_ISREG(st.st_mode):
            raise NotFound(f"{key} in {self.url} is no longer a regular file")
        return ObjectInfo(st.st_size, self._etag(st)), None

    def open(self, key: str) -> pa.NativeFile:
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object {key} in {self.url}") from None
        except OSError:  # a link (ELOOP), or no permission
            os_error = True
        else:
            os_error = False
        if os_error:
            raise NotFound(f"{key} in {self.url} cannot be opened as a regular file")
        fh = os.fdopen(fd, "rb")
        link = Path(f"/proc/self/fd/{fd}")
        real = Path(os.readlink(link)) if link.is_symlink() else self._path(key)
        st = os.fstat(fd)
        if not (real.is_relative_to(self.root) and stat.S_ISREG(st.st_mode)):
            fh.close()
            raise NotFound(f"{key} in {self.url} is not a file under it")
        return pa.PythonFile(fh, mode="r")


def _walk(folder: Path, above: str, url: str) -> Iterator[str]:
    """Keys of the regular files under ``folder`` in S3's order (a folder sorts as its
    name plus '/'); a symbolic link or special file refuses the source."""
    with os.scandir(folder) as it:
        entries = sorted(((e.name + "/" if e.is_dir(follow_symlinks=False) else e.name), e)
                         for e in it)
    for name, entry in entries:
        if entry.is_symlink():
            raise _invalid(f"{above + name} in source {url} is a symbolic link: a source"
                           " folder holds regular files and folders only")
        if name.endswith("/"):
            yield above + name
            yield from _walk(Path(entry.path), above + name, url)
        elif entry.is_file(follow_symlinks=False):
            yield above + name
        else:
            raise _invalid(f"{above + name} in source {url} is not a regular file")


def _s3(url: str, bucket: str, path: str, endpoint: str | None, max_files: int) -> Source:
    try:
        if path.endswith(SUFFIX):
            folder, _, name = path.rpartition("/")
            store = from_url(f"s3://{bucket}/{folder}", endpoint)
            _check_name(name, url)
            try:
                store.head(name)
            except NotFound:
                raise _missing(url) from None
            return Source(url, store, [name], [])
        store = from_url(f"s3://{bucket}/{path}", endpoint)
    except ValueError as exc:  # a bucket or key S3 cannot have
        raise _invalid(f"source {url}: {exc}") from None
    keys, skipped = _sorted_keys(store.list(), url, max_files)
    return Source(url, store, keys, skipped)


def _sorted_keys(listed: Iterator[str], url: str, max_files: int
                 ) -> tuple[list[str], list[str]]:
    """The Parquet keys and the hidden ones of a listing (a folder entry ends with '/'),
    refusing any other object and a listing longer than ``max_files``."""
    keys: list[str] = []
    skipped: list[str] = []
    for count, key in enumerate(listed, 1):
        if count > max_files:
            raise _invalid(f"source {url} holds more than {max_files} objects"
                           " (PRIVRELEASE_MAX_SOURCE_FILES)")
        if any(part.startswith(HIDDEN) for part in key.rstrip("/").split("/")):
            if not key.endswith("/"):
                skipped.append(key)
        elif not key.endswith("/"):
            _check_name(key, url)
            keys.append(key)
    if not keys:
        raise _missing(url)
    return keys, skipped


def _check_name(key: str, url: str) -> None:
    if not key.endswith(SUFFIX):
        raise _invalid(f"{key} in source {url} is not a {SUFFIX} file: a source holds"
                       f" Parquet files (names starting with '_' or '.' are skipped)")
    try:
        check_key(key)
    except ValueError:
        raise _invalid(f"a key in source {url} is not '/'-separated segments of"
                       " [A-Za-z0-9._-]; rename it") from None


def _missing(url: str) -> SourceError:
    return SourceError(422, "source_not_found", f"no Parquet object at or under {url}")


# -- one scan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """One object as it was read."""

    key: str
    info: ObjectInfo
    version: str | None

    def doc(self) -> dict[str, Any]:
        return {"key": self.key, "size": self.info.size, "etag": self.info.etag,
                **({"version_id": self.version} if self.version else {})}


@dataclass
class Scan:
    """A source's chunks (``chunks``, read once) and, once read, its pins."""

    source: Source
    spec: DatasetSpec
    max_rows: int
    pins: list[Pin] = field(default_factory=list)

    def chunks(self) -> Iterator[dict[str, np.ndarray]]:
        """The objects' rows, validated and converted as an upload's, object by object;
        IngestError (prefixed with the object's key), SourceError 409 if an object
        changed while it was read."""
        seen = 0
        for key in self.source.keys:
            before = self._stat(key)
            try:
                with _reading(self.source.url), self.source.store.open(key) as fh:
                    rows = _rows(fh)
                    if seen + rows > self.max_rows:
                        raise IngestError("file", f"more than {self.max_rows} data rows")
                    yield from iter_parquet(cast(BinaryIO, fh), self.spec, max_rows=rows,
                                            empty_ok=True)
            except IngestError as err:
                self._check(key, before)  # a change or an outage is the reason to give
                raise IngestError("source" + err.field.removeprefix("file"),
                                  f"{key}: {err.message}") from None
            except NotFound:
                raise self._changed(key) from None
            self._check(key, before)
            self.pins.append(Pin(key, *before))
            seen += rows
        if seen == 0:
            raise IngestError("source", "the source has no data rows")

    def _stat(self, key: str) -> tuple[ObjectInfo, str | None]:
        try:
            with _reading(self.source.url):
                return self.source.store.stat(key)
        except NotFound:  # listed, then gone
            raise self._changed(key) from None

    def _check(self, key: str, before: tuple[ObjectInfo, str | None]) -> None:
        if self._stat(key) != before:
            raise self._changed(key)

    def _changed(self, key: str) -> SourceError:
        return SourceError(409, "source_changed", f"{key} in source {self.source.url} changed"
                           " while it was read (its size, ETag or version is not the one"
                           " first read): nothing was stored; register it once it is stable")

    def record(self) -> dict[str, Any]:
        """What the version's manifest keeps: the summary and every pin and skipped key."""
        return {**self.summary(), "pins": [p.doc() for p in self.pins],
                "skipped_keys": list(self.source.skipped)}

    def summary(self) -> dict[str, Any]:
        """What the version's document shows: the URL, counts and a digest of the pins
        (equal digests: the same objects, unchanged)."""
        pins = json.dumps([p.doc() for p in self.pins], sort_keys=True, separators=(",", ":"))
        return {"url": self.source.url, "objects": len(self.pins),
                "bytes": sum(p.info.size for p in self.pins),
                "pins_sha256": hashlib.sha256(pins.encode()).hexdigest(),
                "skipped": len(self.source.skipped)}

    def warnings(self) -> list[dict[str, Any]]:
        """The answer's warning about skipped hidden objects (none skipped: none)."""
        skipped = self.source.skipped
        if not skipped:
            return []
        return [{"code": "skipped_objects", "count": len(skipped),
                 "names": skipped[:WARN_NAMES],
                 "message": "objects whose name has a segment starting with '_' or '.' were"
                            " skipped (hidden files: markers, checksums); the version's"
                            " manifest lists them all"}]


def _rows(fh: pa.NativeFile) -> int:
    """The object's row count from its footer; IngestError if it is not Parquet."""
    rows: int | None = None
    with contextlib.suppress(pa.ArrowException, OSError, ValueError):
        rows = int(pq.read_metadata(fh).num_rows)
    if rows is None:  # raised outside the handler: Arrow's messages may quote bytes
        raise IngestError("file", "not a readable Parquet file")
    fh.seek(0)
    return rows

