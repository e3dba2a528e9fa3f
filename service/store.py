"""Dataset versions on disk: one folder of columnar ``.npy`` files per version.

Layout (DESIGN §2)::

    <root>/<dataset_id>/v<version>/manifest.json
    <root>/<dataset_id>/v<version>/c0.npy, c1.npy, ...
    <root>/.tmp/                      versions being written or removed

Workers memory-map the columns, so a version folder must never be seen half
written: it is built under ``.tmp`` (same filesystem), fsynced, then renamed
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
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
FORMAT = 1
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FILE = re.compile(r"c[0-9]+\.npy")


def _check_id(dataset_id: object) -> str:
    if not isinstance(dataset_id, str) or _ID.fullmatch(dataset_id) is None:
        raise ValueError("dataset id must match ^[A-Za-z0-9_-]{1,64}$")
    return dataset_id


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("version must be a positive integer")
    return version


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (created or renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    def path(self, dataset_id: str, version: int) -> Path:
        """Folder of one version (validates both parts, so it never escapes ``root``)."""
        return self.root / _check_id(dataset_id) / f"v{_check_version(version)}"

    def exists(self, dataset_id: str, version: int) -> bool:
        return (self.path(dataset_id, version) / MANIFEST).is_file()

    def write(
        self,
        dataset_id: str,
        version: int,
        manifest: dict[str, Any],
        columns: dict[str, np.ndarray],
    ) -> Path:
        """Write a new version atomically and return its folder.

        Raises FileExistsError if the version exists (versions are immutable:
        releases refer to them), ValueError for a bad id or version, an
        object-dtype column, or a manifest that is not strict JSON. On any
        failure nothing is left behind, neither the folder nor a temp dir.
        """
        final = self.path(dataset_id, version)
        if final.exists():
            raise FileExistsError(f"dataset {dataset_id} version {version} already exists")
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{dataset_id}-v{version}-", dir=self.tmp_dir))
        parent = final.parent
        created_parent = False
        try:
            entries = []
            for index, (name, values) in enumerate(columns.items()):
                if not isinstance(name, str):
                    raise TypeError("column names must be strings")
                array = np.asarray(values)
                file = f"c{index}.npy"
                with open(tmp / file, "wb") as fh:
                    # allow_pickle=False: object arrays fail here instead of being pickled
                    np.save(fh, array, allow_pickle=False)
                    fh.flush()
                    os.fsync(fh.fileno())
                entries.append(
                    {"name": name, "file": file, "dtype": array.dtype.str, "shape": array.shape}
                )
            document = {"format": FORMAT, "manifest": manifest, "columns": entries}
            text = json.dumps(document, allow_nan=False, ensure_ascii=False, indent=1)
            with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            _fsync_dir(tmp)
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
            _fsync_dir(parent)
            if created_parent:
                _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if created_parent:
                with contextlib.suppress(OSError):  # not empty: another version landed
                    parent.rmdir()
            raise
        return final

    def load(self, dataset_id: str, version: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The stored manifest and the columns, memory-mapped read-only, in stored order."""
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
            if np.prod(entry["shape"], dtype=np.int64) > 0:
                columns[entry["name"]] = np.load(path, mmap_mode="r", allow_pickle=False)
            else:
                columns[entry["name"]] = np.load(path, allow_pickle=False)
        manifest: dict[str, Any] = document["manifest"]
        return manifest, columns

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
