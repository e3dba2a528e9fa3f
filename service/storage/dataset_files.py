"""Dataset versions as immutable Parquet objects in the object store (``objects``).

Layout (keys of the store; DESIGN §2)::

    datasets/<dataset_id>/v<version>/data.parquet     the columns, named c0, c1, ...
    datasets/<dataset_id>/v<version>/row_key          secret (mechanisms.rows), never served
    datasets/<dataset_id>/v<version>/manifest.json    written last

A version exists iff its manifest does. Every object is written once with a conditional
put (``ObjectStore.put_new``), never renamed or linked, so nothing needs one POSIX disk
shared by the hosts. ``commit`` puts the data object first: that put is the version's lock
(a second writer of the version gets FileExistsError and touches nothing); then the
secret files, then the manifest, which pins the data object's size, ETag and SHA-256
(hashed as it is uploaded). ``load``, ``batches`` and ``files_present`` refuse a data
object that is not the pinned one (``ChangedObject``), so a replaced object is detected,
never used; one under another ETag with the pinned size is read whole once and accepted
if its SHA-256 is the pinned one (the same bytes stored again: a restored directory,
versions copied to another store). A failed commit leaves no manifest and removes
what it put (best-effort; the orphan sweeps remove the rest after an hour), and
``remove`` deletes the manifest first and the data object last, so no reader sees half a
version and the lock is the last thing to go.

The Parquet file keeps each column exactly as the array given: its dtype and trailing
shape are in the manifest and restored on reading. Names in the file are positional,
never the user's. Row groups hold ``group_rows`` rows (``ROW_GROUP_ROWS``, fewer for wide
rows: the schema's cells per row, public), so a reader streams one group at a time and a
writer buffers at most one group. Pages are written plain: no compression, no
dictionaries, no statistics, so an object's size and its read time follow from the
schema and the row count, not from the values (text columns aside), and no minimum or
maximum of the data sits in a footer.

A process keeps a small version read whole (``SMALL_BYTES``, at most ``KEPT_BYTES`` of
them, least recently used out): read once and checked against its pin, immutable, so a
worker running many small releases reads each version once, as the page cache served the
memory-mapped ``.npy`` columns before. A change to its objects after that read is refused
by every process that reads them again, and the keeping process keeps releasing on the
pinned values it read: a changed object is never used.

Staging writes the row groups to a local temporary file (``staging_dir``: per host, not
shared), one chunk at a time, and ``commit`` streams it to the store.

Versions written before this format (a folder of ``c<i>.npy`` files with a manifest of
``format`` 1, possibly under another prefix: release tables were under ``releases/``)
are read in place, read-only, through the same store (``_legacy_load``; and
``_legacy_batches``, by byte ranges); no conversion runs.
Under the default ``file://`` store they are where they were; to move them to S3, copy
the folders as objects (``aws s3 sync <data>/datasets s3://bucket/prefix/datasets``).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from service.storage.objects import (
    AlreadyExists,
    LocalStore,
    NotFound,
    ObjectInfo,
    ObjectStore,
)

MANIFEST = "manifest.json"
DATA = "data.parquet"
FORMAT = 2
#: bytes a data object is hashed in (its SHA-256 is pinned with its ETag)
HASH_BYTES = 1 << 20
#: a version whose data object is at most this many bytes is kept read whole by the
#: process that read it (immutable and checked against its pin when read), at most
#: KEPT_BYTES of them: a worker running many small releases reads each version once
SMALL_BYTES = 1 << 20
KEPT_BYTES = 64 << 20
#: the ``.npy`` folder format, read in place (``_legacy_load``)
LEGACY_FORMAT = 1
#: rows of a row group of narrow rows (the ingest's chunk, ``ingest.CHUNK_ROWS``): a
#: writer buffers one group of every column, a reader one group of the columns it reads
ROW_GROUP_ROWS = 1 << 16
#: and at most this many cells (a row of a 2,000-point functional column is 2,000)
ROW_GROUP_CELLS = 1 << 22
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FILE = re.compile(r"c[0-9]+\.npy")
#: secret objects of a version (the row-order key): not columns, not in the manifest
_PRIVATE = re.compile(r"[a-z]+_[a-z]+")
#: a version's key segment (``v1``, ``v2``, ...; never ``v0`` or ``v01``)
_VERSION = re.compile(r"v([1-9][0-9]{0,17})")
#: numpy kinds Arrow stores as themselves; the rest (complex, void, ...) as raw bytes
_NATIVE = frozenset("biufUSmM")
_TIME_UNITS = frozenset({"s", "ms", "us", "ns"})


class ChangedObject(ValueError):
    """A version's data object is not the one its manifest pinned (size or ETag)."""


@dataclass(frozen=True)
class ParquetSource:
    """A stored version as another engine reads it (``service.engines``): its data object
    at ``path`` in ``filesystem``, the Parquet column of each column name, and the object
    as it was pinned when this was made (``DatasetStore.check_source`` after the reads)."""

    path: str
    filesystem: pafs.FileSystem
    columns: dict[str, str]
    pinned: ObjectInfo


def _plain(entry: Mapping[str, Any]) -> bool:
    """Whether an engine that reads the Parquet column directly gets the array ``load``
    gives: numbers or bools kept natively (what ingest stores), one a row, or a fixed
    number a row (a functional column's grid points: a fixed-size list the engine reads
    as (rows, width), ``service.engines.row_groups.read``)."""
    return (not entry.get("raw") and len(entry["shape"]) in (1, 2)
            and np.dtype(entry["dtype"]).kind in "biuf")


@dataclass(frozen=True)
class _Loaded:
    """A version read whole and checked against its pin: its document and its columns
    (read-only arrays), and its data object's size (what keeping it costs)."""

    document: dict[str, Any]
    columns: dict[str, np.ndarray]
    size: int


def _slices(kept: _Loaded, columns: Sequence[str] | None, rows: int | None
            ) -> Iterator[dict[str, np.ndarray]]:
    """``batches`` of a version kept read whole: the same checks and batch lengths."""
    names = [e["name"] for e in kept.document["columns"]]
    wanted = list(names if columns is None else columns)
    unknown = [name for name in wanted if name not in names]
    if unknown or len(set(wanted)) != len(wanted):
        raise KeyError("batches: columns must be distinct columns of the version")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ValueError("batches: rows must be a positive integer")
    size = rows or int(kept.document["group_rows"])
    total = int(kept.document["rows"])
    for start in range(0, total, size):
        yield {name: kept.columns[name][start:start + size] for name in wanted}


def _check_id(dataset_id: object) -> str:
    if not isinstance(dataset_id, str) or _ID.fullmatch(dataset_id) is None:
        raise ValueError("dataset id must match ^[A-Za-z0-9_-]{1,64}$")
    return dataset_id


def _check_private(name: str) -> str:
    """A private object's name: plain, and never one a column or the manifest could take."""
    if _PRIVATE.fullmatch(name) is None:
        raise ValueError("private file names are lower-case words")
    return name


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("version must be a positive integer")
    return version


def _raw(dtype: np.dtype[Any]) -> bool:
    """Whether a column is stored as raw fixed-width bytes: a dtype Arrow has no type for
    (complex, void, times in other units), or a non-native byte order, restored on
    reading. Text is never raw."""
    if dtype.kind in "US":
        return dtype.itemsize == 0
    if dtype.kind not in _NATIVE or (not dtype.isnative and dtype.itemsize > 1):
        return True
    if dtype.kind in "mM":  # Parquet keeps times in ms, us or ns (seconds would be scaled)
        units = _TIME_UNITS if dtype.kind == "m" else _TIME_UNITS - {"s"}
        return np.datetime_data(dtype) not in {(unit, 1) for unit in units}
    return False


def group_rows(cells_per_row: int) -> int:
    """Rows of a row group for rows of ``cells_per_row`` cells (public: the schema)."""
    return max(1, min(ROW_GROUP_ROWS, ROW_GROUP_CELLS // max(cells_per_row, 1)))


def _to_arrow(array: np.ndarray) -> pa.Array:
    """A column chunk as Arrow: values natively (text as strings) or as raw bytes, a
    trailing shape as fixed-size lists of the flattened cells."""
    cells = math.prod(array.shape[1:])
    flat = array.reshape(-1)
    if _raw(array.dtype):
        width = array.dtype.itemsize
        values: pa.Array = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), len(flat), [None, pa.py_buffer(flat.tobytes())])
    elif array.dtype.kind in "mM":  # by their integers: NaT is a value, not a null
        unit = np.datetime_data(array.dtype)[0]
        values = pa.array(flat.view(np.int64), pa.timestamp(unit) if array.dtype.kind == "M"
                          else pa.duration(unit))
    elif array.dtype.kind in "US":  # via Python: Arrow's numpy path cuts text at a NUL
        values = pa.array(flat.tolist(), pa.string() if array.dtype.kind == "U" else pa.binary())
    else:
        values = pa.array(flat)
    if array.ndim == 1:
        return values
    return pa.FixedSizeListArray.from_arrays(values, cells)


def _to_numpy(column: pa.ChunkedArray, entry: Mapping[str, Any], rows: int) -> np.ndarray:
    """A stored column (or a slice of it) as the array it was written from, read-only."""
    dtype, trailing = np.dtype(entry["dtype"]), tuple(entry["shape"][1:])
    values = column.combine_chunks()
    if trailing:
        values = values.flatten()  # the cells of the rows, offset applied
    if entry.get("raw"):
        if dtype.itemsize == 0:
            out = np.zeros(len(values), dtype)
        else:
            buffer = values.buffers()[1]
            out = np.frombuffer(buffer, dtype=dtype, count=len(values),
                                offset=values.offset * dtype.itemsize)
    else:
        out = values.to_numpy(zero_copy_only=False)
        if out.dtype != dtype:
            out = out.astype(dtype)
    out = out.reshape((rows, *trailing))
    out.flags.writeable = False  # a run alters nothing it reads
    return out


class DatasetStore:
    """Versioned, immutable datasets (or release tables) under ``prefix`` of ``objects``.

    ``legacy_prefix``: where ``.npy`` folders of this store's kind were written before
    (default ``prefix``); ``staging_dir``: the local folder staged versions are written
    to before they are stored (default: the system's temporary folder).
    """

    def __init__(self, objects: ObjectStore, prefix: str = "datasets", *,
                 legacy_prefix: str | None = None, staging_dir: Path | None = None) -> None:
        for name in (prefix, legacy_prefix):
            if name is not None and _ID.fullmatch(name) is None:
                raise ValueError("a dataset store's prefix is one key segment")
        self.objects = objects
        self.prefix = prefix
        self.legacy_prefix = prefix if legacy_prefix is None else legacy_prefix
        self.staging_dir = Path(staging_dir or tempfile.gettempdir())
        self._small: OrderedDict[tuple[str, int], _Loaded] = OrderedDict()
        self._small_bytes = 0
        self._small_lock = threading.Lock()

    # -- small versions, kept read ------------------------------------------------

    def _kept(self, dataset_id: str, version: int) -> _Loaded | None:
        with self._small_lock:
            found = self._small.get((dataset_id, version))
            if found is not None:
                self._small.move_to_end((dataset_id, version))
            return found

    def _keep(self, dataset_id: str, version: int, loaded: _Loaded) -> None:
        """Keep a version read whole if its data object is small (``SMALL_BYTES``, from
        the manifest: public sizes), the least recently used going past ``KEPT_BYTES``."""
        if loaded.size > SMALL_BYTES:
            return
        with self._small_lock:
            if (dataset_id, version) in self._small:
                return
            self._small[(dataset_id, version)] = loaded
            self._small_bytes += loaded.size
            while self._small_bytes > KEPT_BYTES:
                _, gone = self._small.popitem(last=False)
                self._small_bytes -= gone.size

    # -- keys ---------------------------------------------------------------------

    def key(self, dataset_id: str, version: int) -> str:
        """Key prefix of one version (validates both parts, so it never escapes ``prefix``)."""
        return f"{self.prefix}/{_check_id(dataset_id)}/v{_check_version(version)}"

    def _legacy_key(self, dataset_id: str, version: int) -> str:
        return f"{self.legacy_prefix}/{_check_id(dataset_id)}/v{_check_version(version)}"

    # -- reading ------------------------------------------------------------------

    def _document(self, dataset_id: str, version: int) -> tuple[str, dict[str, Any]]:
        """The version's key prefix and its stored manifest document (FileNotFoundError if
        the version does not exist; ValueError if the document is not one of ours)."""
        for base in dict.fromkeys((self.key(dataset_id, version),
                                   self._legacy_key(dataset_id, version))):
            try:
                raw = self.objects.get(f"{base}/{MANIFEST}")
            except NotFound:
                continue
            document = json.loads(raw)
            if not isinstance(document, dict) or document.get("format") not in (
                    FORMAT, LEGACY_FORMAT):
                raise ValueError(f"unsupported dataset format in {base}")
            return base, document
        raise FileNotFoundError(f"dataset {dataset_id} version {version} does not exist")

    def exists(self, dataset_id: str, version: int) -> bool:
        """Whether the version's manifest is stored (the version exists iff it is)."""
        key, legacy = self.key(dataset_id, version), self._legacy_key(dataset_id, version)
        return any(self.objects.exists(f"{base}/{MANIFEST}")
                   for base in dict.fromkeys((key, legacy)))

    def files_present(self, dataset_id: str, version: int) -> bool:
        """Whether the manifest and the data it pins are there, unchanged.

        Reads the manifest (public: names, dtypes, shapes) and the data object's size
        and ETag, never a value: a worker asks before it reads the data, so a job whose
        files are gone fails where it may still be refunded.
        """
        self.key(dataset_id, version)  # a bad id or version is an error, not an absence
        if self._kept(dataset_id, version) is not None:
            return True  # read whole and checked: the run reads that copy
        try:
            base, document = self._document(dataset_id, version)
            if document["format"] == LEGACY_FORMAT:
                return all(self.objects.exists(f"{base}/{_legacy_file(e)}")
                           for e in document["columns"])
            self._check_pin(base, document)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return True

    def _check_pin(self, base: str, document: Mapping[str, Any]) -> ObjectInfo:
        """The data object's size and ETag, after checking it is the object the manifest
        pinned: the pinned ETag, or, under another ETag (the same bytes stored again: a
        restored directory, versions copied to another store), the pinned size and
        SHA-256, read whole; ChangedObject otherwise (FileNotFoundError if it is gone)."""
        key, pinned = f"{base}/{DATA}", document["data"]
        info = self._head(key)
        if info.etag == pinned["etag"] and info.size == pinned["size"]:
            return info
        if info.size == pinned["size"] and "sha256" in pinned:
            digest = hashlib.sha256()
            with self.objects.open(key) as fh:
                while chunk := fh.read(HASH_BYTES):
                    digest.update(chunk)
            if digest.hexdigest() == pinned["sha256"] and self._head(key) == info:
                return info
        raise ChangedObject(f"the data object of {base} is not the one its manifest "
                            "pinned; refusing to read it")

    def _head(self, key: str) -> ObjectInfo:
        try:
            return self.objects.head(key)
        except NotFound:
            raise FileNotFoundError(f"the data object {key} is missing") from None

    @contextlib.contextmanager
    def _parquet(self, base: str, document: Mapping[str, Any]) -> Iterator[pq.ParquetFile]:
        """The pinned data object, opened, its shape checked against the manifest; after
        the reads it must still be the object checked (a replacement while reading is
        refused too)."""
        info = self._check_pin(base, document)
        with self.objects.open(f"{base}/{DATA}") as fh:
            # no pre-buffering: it reads a column's chunks of every row group at once
            # (the whole column in memory), where a stream wants one group at a time
            parquet = pq.ParquetFile(fh, pre_buffer=False)
            entries = document["columns"]
            if (parquet.metadata.num_rows != document["rows"]
                    or parquet.schema_arrow.names != [f"c{i}" for i in range(len(entries))]):
                raise ChangedObject(f"the data object of {base} does not match its manifest")
            yield parquet
        if self._head(f"{base}/{DATA}") != info:
            raise ChangedObject(f"the data object of {base} changed while it was read")

    def load(self, dataset_id: str, version: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The stored manifest and the columns, in stored order, read into memory
        read-only (one column converted at a time). FileNotFoundError if the version does
        not exist; ChangedObject if its data object is not the pinned one."""
        kept = self._kept(dataset_id, version)
        if kept is not None:
            return copy.deepcopy(kept.document["manifest"]), dict(kept.columns)
        base, document = self._document(dataset_id, version)
        return self._load(dataset_id, version, base, document)

    def _load(self, dataset_id: str, version: int, base: str, document: dict[str, Any]
              ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``load`` from the version's document, already read; a small version kept."""
        if document["format"] == LEGACY_FORMAT:
            return self._legacy_load(base, document)
        columns: dict[str, np.ndarray] = {}
        with self._parquet(base, document) as parquet:
            for index, entry in enumerate(document["columns"]):
                table = parquet.read(columns=[f"c{index}"], use_threads=False)
                columns[entry["name"]] = _to_numpy(table.column(0), entry, document["rows"])
        self._keep(dataset_id, version,
                   _Loaded(copy.deepcopy(document), dict(columns), int(document["data"]["size"])))
        manifest: dict[str, Any] = document["manifest"]
        return manifest, columns

    def batches(self, dataset_id: str, version: int, columns: Sequence[str] | None = None,
                rows: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The version's ``columns`` (default: all, in stored order) as consecutive batches
        of ``rows`` rows (default: a row group's), the last one shorter; memory holds one
        row group of the columns asked. For streaming statistics
        (``mechanisms.statistics.compute``); a statistic of several passes calls again.
        """
        kept = self._kept(dataset_id, version)
        if kept is None:
            base, document = self._document(dataset_id, version)
            if document["format"] == FORMAT and int(document["data"]["size"]) <= SMALL_BYTES:
                # a small version (its manifest's size: public) is read once whole and
                # kept: later runs read nothing
                self._load(dataset_id, version, base, document)
                kept = self._kept(dataset_id, version)
        if kept is not None:
            yield from _slices(kept, columns, rows)
            return
        entries = document["columns"]
        names = [e["name"] for e in entries]
        wanted = list(names if columns is None else columns)
        unknown = [name for name in wanted if name not in names]
        if unknown or len(set(wanted)) != len(wanted):
            raise KeyError("batches: columns must be distinct columns of the version")
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int)
                                 or rows < 1):
            raise ValueError("batches: rows must be a positive integer")
        picked = [(names.index(name), entries[names.index(name)]) for name in wanted]
        if document["format"] == LEGACY_FORMAT:
            yield from self._legacy_batches(base, document, picked, rows)
            return
        size = rows or int(document["group_rows"])
        with self._parquet(base, document) as parquet:
            if not picked:
                for _ in range(0, int(document["rows"]), size):
                    yield {}
                return
            for batch in parquet.iter_batches(batch_size=size, use_threads=False,
                                              columns=[f"c{i}" for i, _ in picked]):
                yield {entry["name"]: _to_numpy(pa.chunked_array([batch.column(j)]), entry,
                                                batch.num_rows)
                       for j, (_, entry) in enumerate(picked)}

    def parquet_source(self, dataset_id: str, version: int) -> ParquetSource | None:
        """The version for an engine that reads Parquet itself (Spark), its data object's
        pin checked; None where only this store reads it right (a ``.npy`` version, or a
        column ``_plain`` does not cover)."""
        base, document = self._document(dataset_id, version)
        if document["format"] == LEGACY_FORMAT or not all(
                _plain(entry) for entry in document["columns"]):
            return None
        pinned = self._check_pin(base, document)
        columns = {entry["name"]: f"c{i}" for i, entry in enumerate(document["columns"])}
        return ParquetSource(f"{base}/{DATA}", self.objects.filesystem, columns, pinned)

    def check_source(self, source: ParquetSource) -> None:
        """After an engine's reads: ChangedObject unless the data object is still the
        pinned one (a replacement while it was read is refused, as ``_parquet`` does)."""
        if self._head(source.path) != source.pinned:
            raise ChangedObject(f"the data object {source.path} changed while it was read")

    def private_file(self, dataset_id: str, version: int, name: str,
                     make: Callable[[], bytes]) -> bytes:
        """A secret object of a version (``row_key``), created by ``make`` if absent.

        Uploads store it with the columns (``StagedVersion.write_private``); a version
        stored before that gets it on first use, by a conditional put: the first writer
        wins and every caller gets the winner's bytes. FileNotFoundError if the version
        does not exist (no secret is made for nothing).
        """
        _check_private(name)
        base, _ = self._document(dataset_id, version)
        key = f"{base}/{name}"
        with contextlib.suppress(NotFound):
            return self.objects.get(key)
        data = make()
        try:
            self.objects.put_new(key, data)
        except AlreadyExists:  # another worker was first: its bytes are the key
            return self.objects.get(key)
        return data

    # -- writing ------------------------------------------------------------------

    def write(
        self,
        dataset_id: str,
        version: int,
        manifest: dict[str, Any],
        columns: Mapping[str, np.ndarray],
    ) -> str:
        """Write a new version and return its key prefix.

        Raises FileExistsError if the version exists (versions are immutable: releases
        refer to them), ValueError for a bad id or version, an object-dtype column, or a
        manifest that is not strict JSON. On any failure no version appears and what
        was written is removed.
        """
        if self.objects.exists(f"{self.key(dataset_id, version)}/{DATA}"):
            raise FileExistsError(f"dataset {dataset_id} version {version} already exists")
        with self.staging() as staged:
            staged.append(columns)
            return staged.commit(dataset_id, version, manifest)

    @contextlib.contextmanager
    def staging(self) -> Iterator[StagedVersion]:
        """A version written chunk by chunk to a local file, removed unless committed.

        For data larger than memory: each ``append`` goes to the file (a row group at a
        time), so a writer holds at most a chunk and a row group, and the version still
        appears in one step at ``commit``.
        """
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="stage-", suffix=".parquet", dir=self.staging_dir)
        os.close(fd)
        staged = StagedVersion(self, Path(name))
        try:
            yield staged
        finally:
            staged.discard()

    def _put_exact(self, key: str, body: bytes) -> None:
        """Put ``body`` under a new key; a key already holding exactly ``body`` is ours (a
        retried put whose first try landed). FileExistsError if it holds other bytes."""
        try:
            self.objects.put_new(key, body)
        except AlreadyExists:
            if self.objects.get(key) != body:
                raise FileExistsError(f"{key} already exists") from None

    # -- removing -----------------------------------------------------------------

    def remove(self, dataset_id: str, version: int) -> bool:
        """Delete a version (rollback of a failed registration, an orphan); False if it
        had no object. The manifest goes first (the version stops existing at once), the
        data object last (it is the version number's lock)."""
        with self._small_lock:
            gone = self._small.pop((dataset_id, version), None)
            if gone is not None:
                self._small_bytes -= gone.size
        keys: set[str] = set()
        for base in dict.fromkeys((self.key(dataset_id, version),
                                   self._legacy_key(dataset_id, version))):
            keys.update(self.objects.list(base + "/"))
        if not keys:
            return False
        for key in sorted(keys, key=_removal_order):
            self.objects.delete(key)
        return True

    def versions(self, dataset_id: str) -> list[int]:
        """The version numbers with any object under this store's prefix (manifest or
        not: orphans of failed commits too), ascending."""
        found = set()
        for base in dict.fromkeys((self.prefix, self.legacy_prefix)):
            for key in self.objects.list(f"{base}/{_check_id(dataset_id)}/"):
                match = _VERSION.fullmatch(key.split("/")[2])
                if match is not None:
                    found.add(int(match[1]))
        return sorted(found)

    def _ages(self, prefixes: Collection[str]) -> dict[tuple[str, int], float]:
        """The newest modification time of each (dataset id, version) with objects under
        the given store prefixes (a listing, no object read)."""
        newest: dict[tuple[str, int], float] = {}
        for prefix in prefixes:
            for key, modified, _ in self.objects.listed(prefix):
                parts = key.split("/")
                if len(parts) < 4 or _ID.fullmatch(parts[1]) is None:
                    continue
                match = _VERSION.fullmatch(parts[2])
                if match is None:
                    continue
                place = (parts[1], int(match[1]))
                newest[place] = max(modified, newest.get(place, modified))
        return newest

    def _bases(self) -> list[str]:
        return [base + "/" for base in dict.fromkeys((self.prefix, self.legacy_prefix))]

    def sweep_tmp(self, older_than: float = 3600.0) -> int:
        """Remove staging files a killed process left behind (and a local store's own
        temporary files); returns how many. Only files untouched for ``older_than``
        seconds go, so a write in progress in another process is never disturbed."""
        cutoff, removed = time.time() - older_than, 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.staging_dir) as it:
            for entry in it:
                if not entry.name.startswith("stage-"):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                        removed += 1
        if isinstance(self.objects, LocalStore):
            removed += self.objects.sweep_tmp(older_than)
        return removed

    def sweep_orphans(self, registered: Collection[str], older_than: float = 3600.0) -> list[str]:
        """Remove the versions of datasets whose id is not in ``registered``; returns the ids.

        A registration that failed without learning whether the record stored it keeps
        its objects (``datasets.register``); this removes them once the id is known to be
        unregistered. Only a dataset none of whose objects was written in the last
        ``older_than`` seconds goes, so a registration in progress (objects committed a
        moment before its metadata) is never disturbed.
        """
        cutoff = time.time() - older_than
        newest: dict[str, float] = {}
        versions: dict[str, list[int]] = {}
        for (dataset_id, version), modified in self._ages(self._bases()).items():
            newest[dataset_id] = max(modified, newest.get(dataset_id, modified))
            versions.setdefault(dataset_id, []).append(version)
        removed = []
        for dataset_id in sorted(newest):
            if dataset_id in registered or newest[dataset_id] >= cutoff:
                continue
            for version in sorted(versions[dataset_id]):
                self.remove(dataset_id, version)
            removed.append(dataset_id)
        return removed

    def sweep_orphan_versions(
            self, registered: Collection[str],
            versions_of: Callable[[list[str]], Mapping[str, Collection[int]]],
            older_than: float = 3600.0) -> list[tuple[str, int]]:
        """Remove versions of registered datasets whose number is not registered;
        returns the (dataset id, version) pairs removed.

        A version upload whose registration never landed (the API died, the record
        refused or could not say) leaves ``v<k>`` under a registered dataset;
        ``sweep_orphans`` keeps the dataset, so this removes the version. ``versions_of``
        is asked, after the objects' ages are read, for the registered versions of the
        datasets that have an old version; a dataset it leaves out (its registration
        could not be read) keeps every version, and an error it raises removes nothing.
        Only versions untouched for ``older_than`` seconds, checked again just before
        removal, go: an upload commits its version a moment before its registration.
        """
        cutoff = time.time() - older_than
        wanted = {d for d in registered if isinstance(d, str) and _ID.fullmatch(d)}
        candidates: dict[str, list[int]] = {}
        for (dataset_id, version), modified in self._ages(self._bases()).items():
            if dataset_id in wanted and modified < cutoff:
                candidates.setdefault(dataset_id, []).append(version)
        if not candidates:
            return []
        known = versions_of(sorted(candidates))
        removed = []
        for dataset_id, numbers in sorted(candidates.items()):
            if dataset_id not in known:
                continue
            keep = set(known[dataset_id])
            for version in sorted(numbers):
                if version in keep:
                    continue
                again = self._ages([f"{base}{dataset_id}/v{version}/" for base in self._bases()])
                if (again and max(again.values()) < cutoff
                        and self.remove(dataset_id, version)):
                    removed.append((dataset_id, version))
        return removed

    # -- the .npy folders of format 1, read in place -----------------------------------

    def _legacy_load(self, base: str, document: Mapping[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        columns: dict[str, np.ndarray] = {}
        for entry in document["columns"]:
            with self.objects.open(f"{base}/{_legacy_file(entry)}") as fh:
                column = np.lib.format.read_array(fh, allow_pickle=False)
            column.flags.writeable = False
            columns[entry["name"]] = column
        manifest: dict[str, Any] = document["manifest"]
        return manifest, columns

    def _legacy_batches(self, base: str, document: Mapping[str, Any],
                        picked: list[tuple[int, Mapping[str, Any]]], rows: int | None
                        ) -> Iterator[dict[str, np.ndarray]]:
        """Row slices of ``.npy`` columns, each read by its byte range (bounded memory)."""
        entries = document["columns"]
        total = int(entries[0]["shape"][0]) if entries else 0
        size = rows or ROW_GROUP_ROWS
        handles = {}
        with contextlib.ExitStack() as stack:
            for _, entry in picked:
                fh = stack.enter_context(self.objects.open(f"{base}/{_legacy_file(entry)}"))
                version = np.lib.format.read_magic(fh)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(fh)
                if fortran or dtype.hasobject or tuple(shape) != tuple(entry["shape"]):
                    raise ValueError(f"corrupt manifest in {base}")
                handles[entry["name"]] = (fh, fh.tell(), dtype, tuple(shape[1:]))
            for start in range(0, total, size):
                count = min(size, total - start)
                batch = {}
                for name, (fh, offset, dtype, trailing) in handles.items():
                    cells = math.prod(trailing)
                    fh.seek(offset + start * cells * dtype.itemsize)
                    data = fh.read(count * cells * dtype.itemsize)
                    column = np.frombuffer(data, dtype=dtype).reshape((count, *trailing))
                    batch[name] = column
                yield batch


def _legacy_file(entry: Mapping[str, Any]) -> str:
    """A format-1 column's file name, checked (a tampered manifest cannot name a path)."""
    file = entry.get("file")
    if not isinstance(file, str) or _FILE.fullmatch(file) is None:
        raise ValueError("corrupt dataset manifest")
    return file


class _Hashing(io.RawIOBase):
    """A binary file read through, hashing what is read (the upload's one pass)."""

    def __init__(self, stream: io.BufferedReader) -> None:
        super().__init__()
        self._stream, self.digest = stream, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = self._stream.readinto(buffer)
        self.digest.update(memoryview(buffer)[:size])
        return size


def _removal_order(key: str) -> tuple[int, str]:
    """The manifest (or a release table's list of parts) first, the data object (the
    version's lock) last."""
    name = key.rsplit("/", 1)[-1]
    return (0 if name.endswith(".json") else 2 if name == DATA else 1, key)


class StagedVersion:
    """Columns being appended to a local Parquet file; ``commit`` stores the version.

    The first ``append`` fixes the column names, dtypes and trailing shapes (and so the
    row-group size). Rows are buffered until a row group is full, so every group but
    the last holds exactly ``group_rows`` rows whatever the chunks' sizes.
    """

    def __init__(self, store: DatasetStore, path: Path) -> None:
        self._store, self._path = store, path
        self._names: list[str] | None = None
        self._entries: list[dict[str, Any]] = []
        self._schema: pa.Schema | None = None
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._rows = 0
        self._group = ROW_GROUP_ROWS
        self._private: dict[str, bytes] = {}
        self._finished = False
        self._done = False

    @property
    def n_rows(self) -> int:
        """The rows appended so far."""
        return self._rows

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Append rows to every column (the same names, dtypes and trailing shapes, and
        one length across the chunk's columns)."""
        if self._done or self._finished:
            raise RuntimeError("version already committed or discarded")
        names = list(columns)
        if self._names is not None and names != self._names:
            raise ValueError("a chunk must have the same columns, in the same order")
        arrays = []
        for name, values in columns.items():
            if not isinstance(name, str):
                raise TypeError("column names must be strings")
            array = np.ascontiguousarray(values)
            if array.dtype.hasobject:  # never pickled
                raise ValueError("object arrays cannot be stored")
            if array.ndim == 0:
                raise ValueError("columns must have at least one dimension")
            if array.ndim > 1 and math.prod(array.shape[1:]) == 0:
                raise ValueError("columns must have at least one cell per row")
            arrays.append(array)
        if len({len(a) for a in arrays}) > 1:
            raise ValueError("columns differ in length")
        if self._names is None:
            self._start(names, arrays)
        else:
            for array, entry in zip(arrays, self._entries, strict=True):
                if (array.dtype.str, list(array.shape[1:])) != (entry["dtype"],
                                                                entry["shape"][1:]):
                    raise ValueError("a chunk's dtype or shape differs from the first chunk's")
        if not arrays:
            return
        batch = pa.RecordBatch.from_arrays([_to_arrow(a) for a in arrays],
                                           schema=self._schema)
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._rows += batch.num_rows
        if self._pending_rows >= self._group:
            self._flush(final=False)

    def _start(self, names: list[str], arrays: list[np.ndarray]) -> None:
        """Fix the schema from the first chunk and open the file."""
        self._names = names
        self._entries = [{"name": name, "column": f"c{i}", "dtype": a.dtype.str,
                          "shape": [0, *a.shape[1:]], **({"raw": True} if _raw(a.dtype) else {})}
                         for i, (name, a) in enumerate(zip(names, arrays, strict=True))]
        self._group = group_rows(sum(math.prod(a.shape[1:]) for a in arrays))
        fields = [pa.field(f"c{i}", _to_arrow(a[:0]).type, nullable=False)
                  for i, a in enumerate(arrays)]
        self._schema = pa.schema(fields)
        self._writer = pq.ParquetWriter(self._path, self._schema, compression="NONE",
                                        use_dictionary=False, write_statistics=False)

    def _flush(self, final: bool) -> None:
        """Write the full row groups buffered (all rows if ``final``), keep the rest."""
        assert self._writer is not None
        table = pa.Table.from_batches(self._pending, schema=self._schema)
        take = table.num_rows if final else table.num_rows - table.num_rows % self._group
        if take:
            self._writer.write_table(table.slice(0, take), row_group_size=self._group)
        rest = table.slice(take)
        self._pending, self._pending_rows = rest.to_batches(), rest.num_rows

    def write_private(self, name: str, data: bytes) -> None:
        """A secret object beside the columns (never in the manifest), stored at commit."""
        if self._done:
            raise RuntimeError("version already committed or discarded")
        if _check_private(name) in self._private:
            raise FileExistsError(f"private file {name} already written")
        self._private[name] = bytes(data)

    def _finish(self) -> None:
        """Write the last rows and close the file, once (kept, so a commit that lost the
        race for its version number can be committed again under the next one)."""
        if self._finished:
            return
        if self._writer is None:  # nothing appended: a version of no columns
            self._names, self._schema = [], pa.schema([])
            self._writer = pq.ParquetWriter(self._path, self._schema, compression="NONE")
        if self._pending_rows or self._pending:
            self._flush(final=True)
        self._writer.close()
        self._finished = True

    def commit(self, dataset_id: str, version: int, manifest: dict[str, Any]) -> str:
        """Store the version; returns its key prefix.

        Raises FileExistsError if the version exists (nothing of it is touched; commit
        again under another number, or leave the ``staging`` block to discard the file);
        on any other failure no manifest is stored and what was put is removed.
        """
        store, objects = self._store, self._store.objects
        base = store.key(dataset_id, version)
        if self._done:
            raise RuntimeError("version already committed or discarded")
        json.dumps(manifest, allow_nan=False)  # not strict JSON: refused before any put
        self._finish()
        size = self._path.stat().st_size
        try:
            with open(self._path, "rb") as fh:
                hashing = _Hashing(fh)
                etag = objects.put_new(f"{base}/{DATA}", io.BufferedReader(hashing, HASH_BYTES))
        except AlreadyExists:
            raise FileExistsError(f"dataset {dataset_id} version {version} already exists"
                                  ) from None
        entries = [{**e, "shape": [self._rows, *e["shape"][1:]]} for e in self._entries]
        document = {"format": FORMAT, "manifest": manifest, "columns": entries,
                    "rows": self._rows, "group_rows": self._group,
                    "data": {"key": DATA, "size": size, "etag": etag,
                             "sha256": hashing.digest.hexdigest()}}
        text = json.dumps(document, allow_nan=False, ensure_ascii=False, indent=1)
        put = [f"{base}/{DATA}"]
        try:
            for name, data in self._private.items():
                store._put_exact(f"{base}/{name}", data)
                put.append(f"{base}/{name}")
            store._put_exact(f"{base}/{MANIFEST}", text.encode())
        except BaseException:
            self._roll_back(base, put)
            raise
        self._done = True
        return base

    def _roll_back(self, base: str, put: list[str]) -> None:
        """Remove what a failed commit put, data last, unless its manifest may have landed
        (a put whose answer was lost): then everything stays, a whole version or an
        orphan for the sweeps."""
        objects = self._store.objects
        try:
            if objects.exists(f"{base}/{MANIFEST}"):
                return
            for key in reversed(put):
                objects.delete(key)
        except Exception:  # the commit's own error is the one to raise
            return

    def discard(self) -> None:
        """Close and remove the staged file (the store's objects are never touched)."""
        if self._writer is not None and not self._finished:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._pending = []
        self._done = True
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
