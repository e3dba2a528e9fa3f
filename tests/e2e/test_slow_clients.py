"""Slow clients against the real `privrelease standalone` (gunicorn + worker + Valkey).

A client that trickles its request head must cost the server a socket, never a
thread, and must be cut off (408, then closed) once PRIVRELEASE_HEADER_TIMEOUT has
passed, however steadily it trickles.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from tests.e2e.harness import TOKEN, Service

HEADER_TIMEOUT = 3.0
SLOW = 20
#: the service's threads: 2 gunicorn workers x 8 (service/processes/server.py)
THREADS = 16


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = Service(tmp_path_factory.mktemp("slow"),
                  env={"PRIVRELEASE_HEADER_TIMEOUT": str(HEADER_TIMEOUT)})
    svc.start()
    yield svc
    if svc.proc and svc.proc.poll() is None:
        svc.stop()


def _outcome(sock: socket.socket, deadline: float) -> tuple[bytes | None, float]:
    """What the server did to a slow socket: the bytes it sent before closing (b"" for
    a plain close), or None if it was still open at ``deadline``; and when."""
    received = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            return None, time.monotonic()
        except ConnectionResetError:
            return received, time.monotonic()
        if not chunk:
            return received, time.monotonic()
        received += chunk
    return None, time.monotonic()


def test_twenty_slow_header_clients_block_nothing_and_are_cut_off(service: Service) -> None:
    """Catches gthread handing a connection to a thread at its first byte: 20
    tricklers then hold all 16 threads, /healthz and GET /v1/datasets time out,
    and the tricklers are never closed (the old worker had no head deadline)."""
    assert SLOW > THREADS
    stop = threading.Event()
    socks: list[tuple[socket.socket, float]] = []
    for _ in range(SLOW):
        s = socket.create_connection(("127.0.0.1", service.port))
        s.sendall(b"GET /v1/datasets HTTP/1.1\r\nHost: slow\r\n")
        socks.append((s, time.monotonic()))

    def trickle() -> None:  # one header byte per socket every 0.2 s, until told to stop
        header = b"X-Slow: " + b"y" * 10_000
        i = 0
        while not stop.wait(0.2):
            for s, _ in socks:
                with contextlib.suppress(OSError):
                    s.send(header[i % len(header):][:1])
            i += 1

    dribbler = threading.Thread(target=trickle, daemon=True)
    dribbler.start()
    try:
        time.sleep(1.0)  # every trickler has sent bytes since it connected
        for _ in range(3):
            for path, headers in (("/healthz", {}),
                                  ("/v1/datasets", {"Authorization": f"Bearer {TOKEN}"})):
                start = time.monotonic()
                resp = requests.get(service.url + path, headers=headers, timeout=2)
                assert resp.status_code == 200, (path, resp.status_code)
                assert time.monotonic() - start < 2
        # the tricklers keep trickling; each is cut off by its head deadline anyway
        for s, connected in socks:
            got, when = _outcome(s, connected + HEADER_TIMEOUT + 3)
            assert got is not None, "a slow client was never cut off"
            assert got == b"" or got.startswith(b"HTTP/1.1 408 "), got[:40]
            assert when - connected >= HEADER_TIMEOUT - 0.5
    finally:
        stop.set()
        dribbler.join()
        for s, _ in socks:
            s.close()
    # and the server serves normally afterwards, keep-alive included
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(service.url + "/healthz", timeout=2).status_code == 200


def test_head_in_pieces_is_served(service: Service) -> None:
    """A head that arrives in several segments (the worker reassembles it) within the
    deadline is served, and the body that follows it in the same segment is read."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
        body = b'{"a": 1}'
        s.sendall(b"POST /v1/releases HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        s.sendall(b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Type: appl")
        time.sleep(0.3)
        s.sendall(b"ication/json\r\nContent-Length: " + str(len(body)).encode()
                  + b"\r\nConnection: close\r\n\r\n" + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    # the body was read and judged: a release request without its fields
    assert answer.startswith(b"HTTP/1.1 422 "), answer[:60]
    assert b"dataset_id" in answer


def test_pipelined_partial_head_holds_no_thread(service: Service) -> None:
    """Catches the kept-alive path: a client that sends a whole request plus the start
    of the next one got its connection handed straight back to a thread after the
    answer (gunicorn saw buffered bytes), where it blocked on the rest of the head."""
    first = b"GET /healthz HTTP/1.1\r\nHost: slow\r\n\r\n"
    socks = []
    for _ in range(SLOW):
        s = socket.create_connection(("127.0.0.1", service.port))
        s.sendall(first + b"GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Slow: ")
        socks.append((s, time.monotonic()))
    try:
        time.sleep(1.0)
        for _ in range(3):
            start = time.monotonic()
            assert requests.get(service.url + "/healthz", timeout=2).status_code == 200
            assert time.monotonic() - start < 2
        for s, connected in socks:
            got, _ = _outcome(s, connected + HEADER_TIMEOUT + 3)
            assert got is not None, "a pipelining slow client was never cut off"
            assert got.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in got, got[:80]
    finally:
        for s, _ in socks:
            s.close()


def test_oversized_head_is_refused_without_a_thread(service: Service) -> None:
    """A head past 64 KiB is answered 431 by the event loop (the old worker handed
    it to a thread, which a client could then hold by trickling the rest)."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70_000)
        got, _ = _outcome(s, time.monotonic() + 5)
    assert got is not None and got.startswith(b"HTTP/1.1 431 "), (got or b"")[:60]
