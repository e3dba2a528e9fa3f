"""Dataset versions on disk: one folder of columnar ``.npy`` files per version.

Layout (DESIGN §2)::

    <root>/<dataset_id>/v<version>/manifest.json
    <root>/<dataset_id>/v<version>/c0.npy, c1.npy, ...
    <root>/<dataset_id>/v<version>/row_key     secret (mechanisms.rows), never served
    <root>/.tmp/                      versions being written or removed

Workers memory-map the columns (small ones they read), so a version folder must never
be seen half written: it is built under ``.tmp`` (same filesystem), fsynced, then renamed
into place in one step, and never modified afterwards. File names are
positional (``c<i>.npy``), never derived from user-chosen column names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from service.storage.objects import fsync_dir

MANIFEST = "manifest.json"
FORMAT = 1
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FILE = re.compile(r"c[0-9]+\.npy")
#: a column of at most this many bytes is read into memory; a larger one memory-mapped
READ_BYTES = 1 << 18
#: secret files of a version (the row-order key): not columns, not in the manifest
_PRIVATE = re.compile(r"[a-z]+_[a-z]+")


#: a version's folder name (``v1``, ``v2``, ...; never ``v0`` or ``v01``)
_VERSION_DIR = re.compile(r"v([1-9][0-9]{0,17})")


def _older(path: Path, cutoff: float) -> bool:
    """Whether ``path`` was last modified before ``cutoff`` (False if it is gone)."""
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False


def _check_id(dataset_id: object) -> str:
    if not isinstance(dataset_id, str) or _ID.fullmatch(dataset_id) is None:
        raise ValueError("dataset id must match ^[A-Za-z0-9_-]{1,64}$")
    return dataset_id


def _check_private(name: str) -> str:
    """A private file's name: plain, and never one a column or the manifest could take."""
    if _PRIVATE.fullmatch(name) is None:
        raise ValueError("private file names are lower-case words")
    return name


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("version must be a positive integer")
    return version



class DatasetStore:
    """Versioned, immutable dataset folders under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def tmp_dir(self) -> Path:
        return self.root / ".tmp"

    def sweep_tmp(self, older_than: float = 3600.0) -> int:
        """Remove temp folders a killed process left behind; returns how many.

        Only folders untouched for ``older_than`` seconds go, so a write in
        progress in another process is never disturbed.
        """
        if not self.tmp_dir.exists():
            return 0
        cutoff = time.time() - older_than
        stale = [p for p in self.tmp_dir.iterdir() if p.stat().st_mtime < cutoff]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return len(stale)

    def sweep_orphans(self, registered: Collection[str], older_than: float = 3600.0) -> list[str]:
        """Remove dataset folders whose id is not in ``registered``; returns the ids.

        A registration that failed without learning whether Valkey stored it
        keeps its files (``datasets.register``); this removes them once the
        id is known to be unregistered. Only folders untouched for
        ``older_than`` seconds go, so a registration in progress (files
        committed a moment before its metadata) is never disturbed.
        """
        if not self.root.exists():
            return []
        cutoff = time.time() - older_than
        removed = []
        for folder in self.root.iterdir():
            if (_ID.fullmatch(folder.name) is None or folder.name in registered
                    or folder.stat().st_mtime >= cutoff):
                continue
            for version in folder.glob("v*"):
                if version.name[1:].isdigit():
                    self.remove(folder.name, int(version.name[1:]))
            removed.append(folder.name)
        return removed

    def sweep_orphan_versions(
            self, registered: Collection[str],
            versions_of: Callable[[list[str]], Mapping[str, Collection[int]]],
            older_than: float = 3600.0) -> list[tuple[str, int]]:
        """Remove version folders of registered datasets whose number is not registered;
        returns the (dataset id, version) pairs removed.

        A version upload whose registration never landed (the API died, Valkey refused
        or could not say) leaves ``v<k>`` under a registered dataset; ``sweep_orphans``
        keeps the dataset's folder, so this removes the version. ``versions_of`` is asked,
        after the folders' ages are read, for the registered versions of the datasets
        that have an old folder; a dataset it leaves out (its registration could not be
        read) keeps every folder, and an error it raises removes nothing. Only folders
        untouched for ``older_than`` seconds, checked again just before removal, go: an
        upload commits its folder a moment before its registration.
        """
        if not self.root.exists():
            return []
        cutoff = time.time() - older_than
        candidates: dict[str, list[int]] = {}
        for dataset_id in registered:
            if _ID.fullmatch(dataset_id) is None:
                continue
            folder = self.root / dataset_id
            if not folder.is_dir():
                continue
            for child in folder.iterdir():
                match = _VERSION_DIR.fullmatch(child.name)
                if match is not None and _older(child, cutoff):
                    candidates.setdefault(dataset_id, []).append(int(match[1]))
        if not candidates:
            return []
        known = versions_of(sorted(candidates))
        removed = []
        for dataset_id, versions in candidates.items():
            if dataset_id not in known:
                continue
            keep = set(known[dataset_id])
            for version in sorted(versions):
                if (version not in keep and _older(self.path(dataset_id, version), cutoff)
                        and self.remove(dataset_id, version)):
                    removed.append((dataset_id, version))
        return removed

    def path(self, dataset_id: str, version: int) -> Path:
        """Folder of one version (validates both parts, so it never escapes ``root``)."""
        return self.root / _check_id(dataset_id) / f"v{_check_version(version)}"

    def exists(self, dataset_id: str, version: int) -> bool:
        return (self.path(dataset_id, version) / MANIFEST).is_file()

    def files_present(self, dataset_id: str, version: int) -> bool:
        """Whether the version's manifest and every column file are there.

        Reads the manifest (public: names, dtypes, shapes) and stats the column
        files, never a value: a worker asks before it reads the data, so a job
        whose files are gone fails where it may still be refunded.
        """
        folder = self.path(dataset_id, version)
        try:
            with open(folder / MANIFEST, encoding="utf-8") as fh:
                entries = json.load(fh)["columns"]
            return all(isinstance(e["file"], str) and _FILE.fullmatch(e["file"]) is not None
                       and (folder / e["file"]).is_file() for e in entries)
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def write(
        self,
        dataset_id: str,
        version: int,
        manifest: dict[str, Any],
        columns: Mapping[str, np.ndarray],
    ) -> Path:
        """Write a new version atomically and return its folder.

        Raises FileExistsError if the version exists (versions are immutable:
        releases refer to them), ValueError for a bad id or version, an
        object-dtype column, or a manifest that is not strict JSON. On any
        failure nothing is left behind, neither the folder nor a temp dir.
        """
        if self.path(dataset_id, version).exists():
            raise FileExistsError(f"dataset {dataset_id} version {version} already exists")
        with self.staging() as staged:
            staged.append(columns)
            return staged.commit(dataset_id, version, manifest)

    @contextlib.contextmanager
    def staging(self) -> Iterator[StagedVersion]:
        """A version written chunk by chunk under ``.tmp``, removed unless committed.

        For data larger than memory: each ``append`` goes straight to the
        column files, so a writer holds one chunk at a time, and the version
        still appears in one rename at ``commit``.
        """
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        staged = StagedVersion(self, Path(tempfile.mkdtemp(prefix="stage-", dir=self.tmp_dir)))
        try:
            yield staged
        finally:
            staged.discard()

    def load(self, dataset_id: str, version: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The stored manifest and the columns, in stored order: memory-mapped read-only,
        or, a column of at most ``READ_BYTES`` (its manifest's shape and dtype: public
        sizes, never a value), read into memory (``_small``): mapping a file costs more
        than reading a small one, and a copy of it costs next to nothing."""
        folder = self.path(dataset_id, version)
        with open(folder / MANIFEST, encoding="utf-8") as fh:
            document = json.load(fh)
        if document.get("format") != FORMAT:
            raise ValueError(f"unsupported dataset format in {folder}")
        columns: dict[str, np.ndarray] = {}
        for entry in document["columns"]:
            file = entry["file"]
            if not isinstance(file, str) or _FILE.fullmatch(file) is None:
                raise ValueError(f"corrupt manifest in {folder}")
            path = folder / file
            # np.load cannot memory-map an empty array; there is nothing to share anyway
            if _small(entry):
                column = np.load(path, allow_pickle=False)
                column.flags.writeable = False  # as a read-only map: a run alters nothing
                columns[entry["name"]] = column
            else:
                columns[entry["name"]] = np.load(path, mmap_mode="r", allow_pickle=False)
        manifest: dict[str, Any] = document["manifest"]
        return manifest, columns

    def private_file(self, dataset_id: str, version: int, name: str,
                     make: Callable[[], bytes]) -> bytes:
        """A secret file of a version (``row_key``), created by ``make`` if absent.

        Uploads write it with the columns (``StagedVersion.write_private``); a version
        stored before that gets it on first use. Creation is atomic (written under
        ``.tmp``, then hard-linked into place), so concurrent workers read one value.
        """
        path = self.path(dataset_id, version) / _check_private(name)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="key-", dir=self.tmp_dir)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(make())
                fh.flush()
                os.fsync(fh.fileno())
            with contextlib.suppress(FileExistsError):  # another worker was first
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
        return path.read_bytes()

    def remove(self, dataset_id: str, version: int) -> bool:
        """Delete a version (rollback of a failed registration); False if absent.

        The folder is first renamed into ``.tmp`` so no reader ever sees a
        half-deleted version.
        """
        final = self.path(dataset_id, version)
        if not final.exists():
            return False
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        doomed = Path(tempfile.mkdtemp(prefix=f"rm-{dataset_id}-v{version}-", dir=self.tmp_dir))
        try:
            os.rename(final, doomed / "v")
        except FileNotFoundError:  # removed concurrently
            doomed.rmdir()
            return False
        shutil.rmtree(doomed, ignore_errors=True)
        with contextlib.suppress(OSError):  # other versions remain
            final.parent.rmdir()
        return True


class StagedVersion:
    """Columns being appended under ``.tmp``; ``commit`` moves them into place.

    Each column is a ``.npy`` file whose header is rewritten with the final
    row count at commit. numpy pads headers so the first dimension can grow
    in place (``np.lib.format.GROWTH_AXIS_MAX_DIGITS``), so the data never
    moves; that is checked rather than assumed. The first ``append`` fixes
    the column names, dtypes and trailing shapes.
    """

    def __init__(self, store: DatasetStore, tmp: Path) -> None:
        self._store, self._tmp = store, tmp
        self._files: dict[str, BinaryIO] = {}
        self._headers: dict[str, dict[str, Any]] = {}
        self._lengths: dict[str, int] = {}
        self._entries: list[dict[str, Any]] | None = None
        self._done = False

    @property
    def n_rows(self) -> int:
        """The common length of the columns appended so far."""
        lengths = set(self._lengths.values())
        if len(lengths) > 1:
            raise ValueError("columns differ in length")
        return lengths.pop() if lengths else 0

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Append rows to every column (the same names, dtypes and trailing shapes)."""
        if self._done:
            raise RuntimeError("version already committed or discarded")
        if self._files and list(columns) != list(self._files):
            raise ValueError("a chunk must have the same columns, in the same order")
        for index, (name, values) in enumerate(columns.items()):
            if not isinstance(name, str):
                raise TypeError("column names must be strings")
            array = np.ascontiguousarray(values)
            if array.dtype.hasobject:  # never pickled: the files are memory-mapped
                raise ValueError("object arrays cannot be stored")
            if array.ndim == 0:
                raise ValueError("columns must have at least one dimension")
            header = np.lib.format.header_data_from_array_1_0(array)
            if name not in self._files:
                fh = open(self._tmp / f"c{index}.npy", "wb")  # noqa: SIM115 (closed at commit)
                self._files[name] = fh
                self._headers[name] = header
                self._lengths[name] = 0
                np.lib.format.write_array_header_1_0(fh, {**header, "shape": (0, *array.shape[1:])})
            elif (header["descr"], header["shape"][1:]) != (
                    self._headers[name]["descr"], self._headers[name]["shape"][1:]):
                raise ValueError("a chunk's dtype or shape differs from the first chunk's")
            self._files[name].write(array.reshape(-1).view(np.uint8).data)
            self._lengths[name] += len(array)

    def write_private(self, name: str, data: bytes) -> None:
        """A secret file beside the columns (owner-only; never in the manifest)."""
        if self._done:
            raise RuntimeError("version already committed or discarded")
        path = self._tmp / _check_private(name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    def commit(self, dataset_id: str, version: int, manifest: dict[str, Any]) -> Path:
        """Finish the column files and move the version into place; returns its folder.

        Raises FileExistsError if the version exists (the staged files stay: commit
        again under another number, or leave the ``staging`` block to discard them);
        on any other failure nothing is left in place.
        """
        store = self._store
        final = store.path(dataset_id, version)
        if self._done:
            raise RuntimeError("version already committed or discarded")
        if final.exists():
            raise FileExistsError(f"dataset {dataset_id} version {version} already exists")
        entries = self._finish()
        document = {"format": FORMAT, "manifest": manifest, "columns": entries}
        text = json.dumps(document, allow_nan=False, ensure_ascii=False, indent=1)
        tmp = self._tmp
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh_manifest:
            fh_manifest.write(text)
            fh_manifest.flush()
            os.fsync(fh_manifest.fileno())
        fsync_dir(tmp)
        parent = final.parent
        created_parent = False
        try:
            if not parent.exists():
                parent.mkdir()
                created_parent = True
            try:
                os.rename(tmp, final)
            except OSError as err:
                # A concurrent writer won the race: the target is a non-empty folder.
                if final.exists():
                    raise FileExistsError(
                        f"dataset {dataset_id} version {version} already exists"
                    ) from err
                raise
            self._done = True
            fsync_dir(parent)
            if created_parent:
                fsync_dir(store.root)
        except BaseException:
            if created_parent and not self._done:
                with contextlib.suppress(OSError):  # not empty: another version landed
                    parent.rmdir()
            raise
        return final

    def _finish(self) -> list[dict[str, Any]]:
        """Write each column's final header and close it, once; the manifest's entries.

        Kept, so a commit that lost the race for its version number (FileExistsError)
        can be committed again under the next number (``datasets.add_version``).
        """
        if self._entries is not None:
            return self._entries
        entries = []
        for name, fh in self._files.items():
            header = {**self._headers[name]}
            header["shape"] = (self._lengths[name], *header["shape"][1:])
            data_start = fh.tell() - self._lengths[name] * _row_bytes(header)
            fh.seek(0)
            np.lib.format.write_array_header_1_0(fh, header)
            if fh.tell() != data_start:  # a numpy without in-place header growth
                raise RuntimeError("numpy changed the .npy header size; cannot finish in place")
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
            entries.append({"name": name, "file": Path(fh.name).name,
                            "dtype": np.dtype(header["descr"]).str, "shape": header["shape"]})
        self._entries = entries
        return entries

    def discard(self) -> None:
        """Remove the staged files (a no-op after a commit).

        Closing flushes what is buffered, which fails on a full or read-only disk: that
        error is the one already being raised, and must not stop the removal (main left
        the partial folder in ``.tmp`` behind it).
        """
        for fh in self._files.values():
            with contextlib.suppress(OSError):
                fh.close()
        if not self._done:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._done = True


def _small(entry: dict[str, Any]) -> bool:
    """Whether a column's manifest entry (its dtype and shape) says it holds at most
    ``READ_BYTES``: an empty one too (np.load cannot memory-map it)."""
    rows = int(np.prod(entry["shape"], dtype=np.int64))
    return rows * np.dtype(entry["dtype"]).itemsize <= READ_BYTES


def _row_bytes(header: dict[str, Any]) -> int:
    """Bytes of one row (one entry of the first dimension) of a column."""
    return int(np.dtype(header["descr"]).itemsize * np.prod(header["shape"][1:], dtype=np.int64))
