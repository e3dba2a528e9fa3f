"""Resident memory of the service's processes, read from /proc (Linux; no psutil needed).

``privrelease standalone`` runs Valkey, ``privrelease worker`` (the Celery main process
and its prefork pool) and ``privrelease api`` (the gunicorn master and its workers) as
its children; each process is named by its role so a report can follow it over time.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, over every process visible now."""
    kids: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def rss_kib(pid: int) -> int | None:
    """VmRSS of ``pid`` in KiB; None once it has exited."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def roles(root: int) -> dict[int, str]:
    """The service's processes under the standalone supervisor ``root``, by role."""
    kids = _children_map()
    out: dict[int, str] = {}
    for child in kids.get(root, []):
        cmd = _cmdline(child)
        if "service.processes.cli api" in cmd:
            out[child] = "api master"
            out.update({pid: "api worker" for pid in kids.get(child, [])})
        elif "service.processes.cli worker" in cmd:
            out[child] = "celery main"
            out.update({pid: "celery pool" for pid in kids.get(child, [])})
        elif "valkey" in cmd:
            out[child] = "valkey"
    return out


#: the groups whose total must stay flat (Valkey holds the data, so it grows by design)
GROUPS = {"api": ("api master", "api worker"), "worker": ("celery main", "celery pool")}


@dataclass
class Sampler:
    """Samples every process's RSS once per ``interval`` in a background thread."""

    root: int
    interval: float = 1.0
    #: (seconds since start, pid, role, rss KiB)
    samples: list[tuple[float, int, str, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    started: float = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic() - self.started
            for pid, role in roles(self.root).items():
                rss = rss_kib(pid)
                if rss is not None:
                    self.samples.append((now, pid, role, rss))
            self._stop.wait(self.interval)

    def _window(self, start: float, end: float) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for t, pid, _, rss in self.samples:
            if start <= t < end:
                out.setdefault(pid, []).append(rss)
        return out

    def table(self, warmup: float, end: float, window: float = 10.0) -> list[MemoryRow]:
        """Per process and per group: median RSS just after warm-up, at the end, max."""
        first = self._window(warmup, warmup + window)
        last = self._window(end - window, end + 1e-9)
        role_of = {pid: role for _, pid, role, _ in self.samples}
        peak: dict[int, int] = {}
        for t, pid, _, rss in self.samples:
            if t >= warmup:
                peak[pid] = max(peak.get(pid, 0), rss)
        rows = [MemoryRow(f"{role_of[pid]} {pid}", int(statistics.median(first[pid])),
                          int(statistics.median(last[pid])), peak[pid])
                for pid in sorted(first.keys() & last.keys(), key=lambda p: role_of[p])]
        for group, members in GROUPS.items():
            def total(win: dict[int, list[int]], members: tuple[str, ...] = members) -> int:
                return sum(int(statistics.median(v)) for p, v in win.items()
                           if role_of[p] in members)
            rows.append(MemoryRow(f"{group} total", total(first), total(last), 0))
        return rows


@dataclass(frozen=True)
class MemoryRow:
    name: str
    start_kib: int
    end_kib: int
    peak_kib: int

    @property
    def growth(self) -> float:
        return self.end_kib / self.start_kib - 1 if self.start_kib else 0.0
