"""A cache for expensive pure precomputations, keyed by their public inputs.

Cost and accuracy of some mechanisms need heavy work that depends only on
public inputs: interval calibration runs the coverage integrator dozens of
times, the ICLP needs a dense eigen-decomposition of its kernel on the grid.
A service answers many requests from several processes, so the results are
kept in a *store* shared by those processes, and a cold computation passes a
*gate* first, so the service can bound how many run at once.

This module knows nothing of the service: it defines the two small protocols
and a directory-backed store, and the service installs both for the duration
of a request with :func:`use`. Outside :func:`use` (notebooks, the worker,
tests) nothing is stored across processes and no gate applies.

Keys are SHA-256 digests of canonical JSON of (namespace, a fingerprint of the
code that computes the value, the inputs), so a code change never reads a
value the old code computed. Values are JSON text or ``.npz`` arrays, never
pickles: a cache file can at worst be wrong data of the right shape, which is
why only public, recomputable quantities go here.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from mechanisms.base import MechanismInputError

T = TypeVar("T")


class Store(Protocol):
    """Bytes by key, shared by every process of a service (a directory, Valkey, ...)."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...


class Busy(Exception):
    """A cold computation was refused by the gate: too many are running already."""


Gate = Callable[[], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _open_gate() -> Iterator[None]:
    yield


@dataclass
class Stats:
    """Hits and misses of this process (tests and metrics)."""

    hits: int = 0
    misses: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self.hits += 1
            else:
                self.misses += 1


STATS = Stats()


@dataclass(frozen=True)
class Context:
    """Where values are shared, what a cold computation must pass first, and the most
    work (in the mechanism's own estimate from public inputs) a request may ask for."""

    store: Store | None = None
    gate: Gate = _open_gate
    max_work: float | None = None
    #: how many times the request may compute each heavy part (a target's search evaluates
    #: the cost at up to ``mechanisms.target.MAX_EVALUATIONS`` budgets): work counts that often
    repeats: int = 1


_CONTEXT: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "privrelease_precompute", default=None)
_NO_SHARING = Context()


@contextlib.contextmanager
def use(store: Store | None, gate: Gate | None = None,
        max_work: float | None = None) -> Iterator[None]:
    """Share results through ``store``, gate cold work with ``gate`` and refuse requests
    whose estimated work exceeds ``max_work`` (None: no limit) inside the block."""
    token = _CONTEXT.set(Context(store, gate or _open_gate, max_work))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


@contextlib.contextmanager
def repeated(times: int) -> Iterator[None]:
    """Within the block each heavy part's work counts ``times`` against the limit: the
    caller may compute it that many times (once per budget a search evaluates)."""
    ctx = _CONTEXT.get() or _NO_SHARING
    token = _CONTEXT.set(Context(ctx.store, ctx.gate, ctx.max_work, ctx.repeats * times))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class DirectoryStore:
    """One file per key under a directory; writes are atomic (temp file + rename),
    so processes sharing the directory read a whole value or none.

    At most about ``max_bytes`` are kept: whenever this object has written a tenth of
    that since it last looked, it sums the directory and deletes the least recently
    used files (reads touch their file) down to 80 %. Inputs are public and chosen by
    callers (an eigen-system is megabytes), so an unbounded cache would be a way to fill
    the disk.
    """

    def __init__(self, root: Path, max_bytes: int = 1 << 30) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._written = max_bytes  # look at the first write
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:  # absent, or the directory is unreadable: a miss
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        return data

    def prune(self) -> None:
        """Delete least recently used entries until the directory holds <= 80 % of the cap."""
        entries = []
        for path in self.root.glob("*/*"):
            with contextlib.suppress(OSError):
                st = path.stat()
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= 0.8 * self.max_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size

    def put(self, key: str, value: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(value)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:  # disk full or read-only: the value is recomputed next time
            return
        with self._lock:
            self._written += len(value)
            due = self._written >= self.max_bytes // 10
            if due:
                self._written = 0
        if due:
            self.prune()


def check_work(field_name: str, work: float) -> None:
    """Refuse a request whose precomputation would exceed the context's work limit.

    Checked whether or not the result is cached, so the answer to a request depends on
    its public inputs only, never on what other callers computed before.
    """
    ctx = _CONTEXT.get() or _NO_SHARING
    total = work * ctx.repeats
    if ctx.max_work is not None and total > ctx.max_work:
        times = f" ({ctx.repeats} budgets evaluated)" if ctx.repeats > 1 else ""
        raise MechanismInputError(
            field_name, f"computing this request's cost takes about {total:.3g} work"
            f" units{times}, more than this server's limit of {ctx.max_work:.3g}")


def code_fingerprint(files: Iterable[str | Path]) -> str:
    """A digest of the source files that compute a cached value (their bytes)."""
    digest = hashlib.sha256()
    for name in sorted(str(f) for f in files):
        digest.update(Path(name).read_bytes())
    return digest.hexdigest()[:16]


def key(namespace: str, code: str, inputs: Any) -> str:
    """The store key of ``inputs`` (JSON-able; floats keep all their digits)."""
    canonical = json.dumps([namespace, code, inputs], sort_keys=True,
                           separators=(",", ":"), default=str, allow_nan=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def cached(cache_key: str, compute: Callable[[], T], encode: Callable[[T], bytes],
           decode: Callable[[bytes], T]) -> T:
    """The stored value of ``cache_key``, else ``compute()`` behind the gate, then stored.

    A value that cannot be decoded (a truncated or foreign file) counts as a miss.
    """
    ctx = _CONTEXT.get() or _NO_SHARING
    if ctx.store is not None:
        raw = ctx.store.get(cache_key)
        if raw is not None:
            try:
                value = decode(raw)
            except (ValueError, KeyError, TypeError, OSError):
                pass
            else:
                STATS.count(True)
                return value
    STATS.count(False)
    with ctx.gate():
        value = compute()
    if ctx.store is not None:
        ctx.store.put(cache_key, encode(value))
    return value


def encode_json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def decode_json(raw: bytes) -> Any:
    return json.loads(raw)


def encode_arrays(value: Mapping[str, NDArray[Any]]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **value)  # type: ignore[arg-type]
    return buf.getvalue()


def decode_arrays(raw: bytes) -> dict[str, NDArray[Any]]:
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}
