"""The audit stream's archive: old ledger events move from Valkey to JSON Lines on disk.

Why: every release adds two events (reserve, commit: ~290 B) to its dataset's stream, so
a stream kept whole in Valkey grows without bound (issue 19 §3: ≤ 1 kB of Valkey per
release, everything counted). The events are the ledger's permanent record, so they are
moved, never dropped: the sweeper appends those older than ``hot_seconds`` to
``<audit_dir>/<dataset id>.jsonl`` (fsynced) and only then trims them from the stream.
:meth:`AuditArchive.merge` reads the file and the stream as one sequence, so the
``/ledger`` view, its export and the console's burn-down do not see the move.

Why this is safe:

- Order: a line is durable before its event leaves the stream, so a crash between the two
  leaves the event in both places; readers skip stream ids the file already has, and the
  next run appends only ids after the file's last. A torn last line (a crash mid-write)
  is cut off before the next append and ignored by readers.
- One archiver at a time (a Valkey lock); if the lock lapses mid-run, the id check above
  still keeps the file free of repeats.
- Only events older than ``hot_seconds`` (default one hour) move. Ledger steps are
  acknowledged by replicas when they happen (``service.storage.durable``), so an hour-old event
  is on the replicas too: a failover cannot resurrect a trimmed event the file lacks, and
  a new primary's stream ids (milliseconds of the clock) start after everything archived.
- The file holds the stream's fields as they were (strings), so one parser
  (``Ledger.events``) reads both.

Multi-host: ``audit_dir`` is on the shared filesystem the datasets and release documents
are on (every API process reads it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import redis

from service.storage import rkeys

log = logging.getLogger("privrelease.audit")

#: events older than this stay in Valkey only this long (PRIVRELEASE_AUDIT_HOT_SECONDS)
HOT_SECONDS = 3600.0
#: most events moved per dataset per run: each run's work is bounded, the next run goes on
BATCH = 10_000
#: most stream events one XRANGE of a read returns: a long read holds one batch at a time
READ_BATCH = 1000
LOCK = f"{rkeys.P}audit:archiving"

StreamId = tuple[int, int]
Event = tuple[str, dict[str, str]]


def parse_id(stream_id: str) -> StreamId:
    """A stream id ``<ms>-<seq>`` (or a bare ``<ms>``) as a comparable pair."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _bound(stream_id: str, low: bool) -> StreamId:
    """XRANGE's bounds as pairs: ``-``/``+`` open, a bare ms the whole millisecond, and a
    leading ``(`` exclusive (as Valkey: the id with its missing sequence filled, then one
    step inward; pairs compare as tuples, so ``(ms, seq ± 1)`` needs no carry)."""
    if stream_id in ("-", "+"):
        return (-1, -1) if stream_id == "-" else (2**63, 2**63)
    exclusive = stream_id.startswith("(")
    ms, sep, seq = stream_id.removeprefix("(").partition("-")
    pair = (int(ms), int(seq)) if sep else (int(ms), 0 if low else 2**63)
    if exclusive:
        return (pair[0], pair[1] + 1) if low else (pair[0], pair[1] - 1)
    return pair


def _low_arg(low: StreamId) -> str:
    """An inclusive lower bound pair as XRANGE's argument."""
    return "-" if low < (0, 0) else f"{low[0]}-{low[1]}"


def after(stream_id: str) -> StreamId:
    """The least id greater than ``stream_id``: where a read that ended there goes on."""
    ms, seq = parse_id(stream_id)
    return ms, seq + 1


class AuditArchive:
    """Per-dataset JSON Lines files of audit events moved out of Valkey."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, dataset_id: str) -> Path:
        if not dataset_id or "/" in dataset_id or dataset_id.startswith("."):
            raise ValueError("not a dataset id")
        return self.root / f"{dataset_id}.jsonl"

    # -- reading ------------------------------------------------------------------------

    def read(self, dataset_id: str, start: str = "-", end: str = "+",
             count: int | None = None) -> Iterator[Event]:
        """The archived events with ids in [start, end] (XRANGE's bounds), oldest first;
        at most ``count`` of them (None: all)."""
        return self._read(dataset_id, _bound(start, True), _bound(end, False), count)

    def _read(self, dataset_id: str, low: StreamId, high: StreamId,
              count: int | None) -> Iterator[Event]:
        if count is not None and count <= 0:
            return
        try:
            f = self.path(dataset_id).open("rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self._first_at_or_after(f, low))
            for line in f:
                if not line.endswith(b"\n"):
                    return  # a torn last line: its event is still in the stream
                item = json.loads(line)
                key = parse_id(item["id"])
                if key > high:
                    return
                if key >= low:
                    yield item["id"], item["fields"]
                    if count is not None:
                        count -= 1
                        if count == 0:
                            return

    @staticmethod
    def _first_at_or_after(f: BinaryIO, low: StreamId) -> int:
        """Offset of a line at or before the first with id >= ``low``: ids grow along the
        file, so a bisection over byte offsets finds it reading O(log size) lines."""
        lo, hi = 0, os.fstat(f.fileno()).st_size
        while hi - lo > 4096:
            mid = (lo + hi) // 2
            f.seek(mid)
            f.readline()  # the rest of the line mid falls in
            line = f.readline()
            if not line.endswith(b"\n") or parse_id(json.loads(line)["id"]) >= low:
                hi = mid
            else:
                lo = mid
        return lo if lo == 0 else AuditArchive._line_start(f, lo)

    @staticmethod
    def _line_start(f: BinaryIO, pos: int) -> int:
        """The offset of the line after the one ``pos`` falls in."""
        f.seek(pos)
        f.readline()
        return f.tell()

    def last_id(self, dataset_id: str) -> StreamId | None:
        """The id of the last whole line (None: nothing archived)."""
        tail = self._tail(dataset_id)
        return parse_id(json.loads(tail)["id"]) if tail else None

    def merge(self, client: redis.Redis, dataset_id: str, start: str = "-",
              end: str = "+", count: int | None = None) -> Iterator[Event]:
        """Archived then live events in [start, end], each once, oldest first; at most
        ``count`` (None: all). Work and memory are bounded by what is yielded: the file is
        entered by bisection, the stream read ``READ_BATCH`` events at a time.

        The archive is a prefix of the stream's history (oldest first, appended before
        trimmed), so: a file whose last id reaches ``end`` holds the whole range; an
        event in both (a crash between append and trim) is taken from the file; and a
        stream batch is kept only if the file did not grow past the read position while
        it was read (else the archiver may have trimmed part of it: read the file again).
        """
        low, high = _bound(start, True), _bound(end, False)
        key = rkeys.events(dataset_id)
        stalled = False
        while count is None or count > 0:
            before = low
            for event_id, fields in self._read(dataset_id, low, high, count):
                low = after(event_id)
                count = None if count is None else count - 1
                yield event_id, fields
            if count == 0:
                return
            last = self.last_id(dataset_id)
            if last is not None and last >= high:
                return  # everything up to end is archived
            if last is not None and last >= low:
                # appended since the read above: read it from the file. Twice in a row
                # with nothing read, the file's ids are out of order (a damaged file):
                # an error, not a request that loops for ever
                if low == before and stalled:
                    raise ValueError("audit archive out of order")
                stalled = low == before
                continue
            stalled = False
            want = READ_BATCH if count is None else min(count, READ_BATCH)
            batch = client.xrange(key, _low_arg(low), end, count=want) if low <= high else []
            last = self.last_id(dataset_id)
            if last is not None and last >= low:
                continue  # moved while the batch was read: the file has them now
            for event_id, fields in batch:
                low = after(event_id)
                count = None if count is None else count - 1
                yield event_id, fields
            if len(batch) < want:
                return

    # -- writing ------------------------------------------------------------------------

    def archive(self, client: redis.Redis, dataset_id: str, hot_seconds: float = HOT_SECONDS,
                batch: int = BATCH) -> int:
        """Move up to ``batch`` events older than ``hot_seconds`` to the file; returns how
        many left the stream."""
        cutoff = int((time.time() - hot_seconds) * 1000)
        if cutoff <= 0:
            return 0
        key = rkeys.events(dataset_id)
        old = client.xrange(key, "-", f"({cutoff}", count=batch)
        if not old:
            return 0
        last = self.last_id(dataset_id) or (-1, -1)
        fresh = [(i, f) for i, f in old if parse_id(i) > last]
        if fresh:
            self._append(dataset_id, fresh)
        ms, seq = parse_id(old[-1][0])
        # exact trim: every id below the one after the last archived (ids only grow)
        return int(client.xtrim(key, minid=f"{ms}-{seq + 1}", approximate=False))

    def _append(self, dataset_id: str, events: list[Event]) -> None:
        path = self.path(dataset_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps({"id": i, "fields": f}, sort_keys=True) + "\n"
                       for i, f in events)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            size = os.fstat(fd).st_size
            keep = self._whole_size(fd, size)
            if keep != size:  # a torn last line from a crash: cut it before appending
                os.ftruncate(fd, keep)
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if size == 0:  # a new file: its name must survive a crash too
            dirfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)

    @staticmethod
    def _whole_size(fd: int, size: int) -> int:
        """Bytes up to and including the file's last newline."""
        pos = size
        while pos > 0:
            step = min(4096, pos)
            chunk = os.pread(fd, step, pos - step)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                return pos - step + cut + 1
            pos -= step
        return 0

    def _tail(self, dataset_id: str) -> str | None:
        """The file's last whole line, read from its end (not the whole file)."""
        try:
            fd = os.open(self.path(dataset_id), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            end = self._whole_size(fd, os.fstat(fd).st_size)
            if end == 0:
                return None
            start = self._whole_size(fd, end - 1)
            return os.pread(fd, end - start, start).decode()
        finally:
            os.close(fd)


def archive_if_due(client: redis.Redis, archive: AuditArchive, interval: float,
                   hot_seconds: float = HOT_SECONDS) -> int:
    """One worker at a time (a lock held for ``interval``): every dataset's old events."""
    if not client.set(LOCK, "1", nx=True, px=max(int(interval * 1000), 1)):
        return 0
    moved = 0
    for dataset_id in client.zrange(rkeys.DATASETS, 0, -1):
        try:
            moved += archive.archive(client, dataset_id, hot_seconds)
        except (OSError, ValueError) as err:  # a shared folder that hiccups, a damaged
            # file (operators are told): the events wait in Valkey, nothing is trimmed
            log.warning("audit archive failed", extra={"dataset_id": dataset_id,
                                                       "error_type": type(err).__name__})
    return moved
