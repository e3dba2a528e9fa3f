"""gunicorn's threaded worker, with request heads read by its event loop under a deadline.

gunicorn's ``gthread`` worker hands a connection to a thread as soon as its first
byte arrives, and the thread then reads the request head with blocking reads: a
client that dribbles header bytes holds a thread for as long as it likes, and a
few dozen of them hold every thread (``/healthz`` stops answering). Here the
worker's main loop (one ``selectors`` poller, non-blocking reads) collects each
request head itself, new connections and kept-alive ones alike, and passes the
connection to a thread only once the head is complete, with the bytes read so
far given back to gunicorn's own parser. A head still incomplete after
``PRIVRELEASE_HEADER_TIMEOUT`` seconds (counted from the first moment we wait
for it, not from the last byte: trickling does not extend it) is answered
``408 Request Timeout`` and closed; one longer than ``MAX_HEAD`` (64 KiB) is
answered 431 and closed. Waiting heads cost a socket and at most 64 KiB each,
not a thread; gunicorn's ``worker_connections`` bounds them per worker.

A body is still read by the thread (uploads stream to disk, up to 1 GiB): a
client that trickles its body holds a thread while it does. A buffering proxy in
front (nginx, HAProxy) is what stops that, as the README says. TLS and HTTP/2
prior-knowledge connections keep gunicorn's own handling (we serve neither; the
proxy in front terminates TLS).
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from collections import deque
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import TConn, ThreadWorker

from service.config import Config

#: what a client that did not finish its head in time gets (then the socket closes)
TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
                    b"Content-Type: text/plain\r\nContent-Length: 0\r\n\r\n")
TOO_LARGE_RESPONSE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                      b"Connection: close\r\nContent-Length: 0\r\n\r\n")
#: the longest head we collect (nginx's default buffers hold 32 KiB); a longer one is
#: answered 431 here, so no client makes us hold more than this per connection
MAX_HEAD = 64 * 1024
_READ = 65536


def _complete(head: bytes | bytearray, start: int = 0) -> bool:
    """Whether ``head`` holds the blank line that ends a request head (searching from
    a little before ``start``, where the bytes before it were already searched)."""
    return (head.find(b"\r\n\r\n", max(0, start - 3)) >= 0
            or head.find(b"\n\n", max(0, start - 1)) >= 0)


class HeaderTimeoutWorker(ThreadWorker):
    """``gthread`` whose threads only ever see complete request heads."""

    header_timeout: float

    def init_process(self) -> None:
        config = Config.from_env()
        self.header_timeout = config.header_timeout
        # connections whose head we are reading, oldest deadline first (one timeout for
        # all, so arrival order is deadline order)
        self.heading: deque[TConn] = deque()
        super().init_process()

    # -- where connections enter ------------------------------------------------------

    def _ours(self, conn: TConn) -> bool:
        """Plain HTTP/1.x, which is all we serve; anything else keeps gunicorn's path."""
        return not self.cfg.is_ssl and not negotiation.prior_knowledge_allowed(
            self.cfg, conn.client)

    def accept(self, listener: socket.socket) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())
        if self._ours(conn):
            self._await_head(conn)
        else:
            client_sock.setblocking(True)
            self.enqueue_req(conn)

    def on_client_socket_readable(self, conn: TConn, client: socket.socket) -> None:
        """A kept-alive connection's next request: its head too is read here."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        if self._ours(conn):
            self._await_head(conn)
        else:
            self.enqueue_req(conn)

    # -- reading heads ----------------------------------------------------------------

    def finish_request(self, conn: TConn, fs: Any) -> None:
        """A kept-alive connection whose client sent part of its next head along with
        the last request (pipelining): that part is in the parser's buffer, and
        gunicorn would give the connection straight back to a thread, to block on the
        rest. Its head is collected here too."""
        if (self._ours(conn) and conn.parser is not None and not fs.cancelled()
                and fs.exception() is None and fs.result() is True and self.alive):
            pending = conn.parser.unreader.buf.getvalue()
            if pending and not _complete(pending):
                conn.parser.unreader.take_buffered()
                self._await_head(conn, pending)
                return
        super().finish_request(conn, fs)

    def _await_head(self, conn: TConn, pending: bytes = b"") -> None:
        """Read what is there already (usually the whole head: then no poller round
        trip), and wait in the poller for the rest under the head deadline."""
        conn.sock.setblocking(False)
        conn.head = bytearray(pending)
        conn.head_deadline = time.monotonic() + self.header_timeout
        conn.polled = False
        self._read_head(conn)
        if conn.head is not None:
            conn.polled = True
            self.heading.append(conn)
            self.poller.register(conn.sock, selectors.EVENT_READ,
                                 partial(self._on_head_readable, conn))

    def _on_head_readable(self, conn: TConn, client: socket.socket) -> None:
        self._read_head(conn)

    def _forget(self, conn: TConn) -> None:
        """Out of the poller and the deadline queue (before a close or a hand-off)."""
        conn.head = None
        if conn.polled:
            conn.polled = False
            self.heading.remove(conn)
            self.poller.unregister(conn.sock)

    def _read_head(self, conn: TConn) -> None:
        """One non-blocking read. A complete head goes to a thread, a connection the
        client closed is closed; otherwise it waits for more."""
        try:
            data = conn.sock.recv(_READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client left before finishing its head
            self._forget(conn)
            self.nr_conns -= 1
            conn.close()
            return
        head = conn.head
        before = len(head)
        head += data
        if _complete(head, before):
            self._forget(conn)
            self._hand_off(conn, bytes(head))
        elif len(head) > MAX_HEAD:
            self._forget(conn)
            self._refuse(conn, TOO_LARGE_RESPONSE)

    def _hand_off(self, conn: TConn, head: bytes) -> None:
        """Give the head to gunicorn's parser and the connection to a thread."""
        conn.sock.setblocking(True)
        if conn.parser is None:  # a new connection: what conn.init() would build
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        conn.parser.unreader.unread(head)
        conn.data_ready = True
        self.enqueue_req(conn)

    def murder_pending(self) -> None:
        """gunicorn's expiry of idle connections, and ours of unfinished heads (all of
        them once the worker stops: they would hold its graceful exit to its end)."""
        super().murder_pending()
        now = time.monotonic()
        while self.heading and (self.heading[0].head_deadline <= now or not self.alive):
            conn = self.heading[0]
            self._forget(conn)
            self._refuse(conn, TIMEOUT_RESPONSE)

    def _refuse(self, conn: TConn, answer: bytes) -> None:
        """Answer without a thread (best effort: the socket is non-blocking) and close."""
        self.nr_conns -= 1
        with contextlib.suppress(OSError):
            conn.sock.send(answer)
        conn.close()

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        # wake up for the next head deadline rather than up to a second after it
        if self.heading:
            timeout = min(timeout, max(self.heading[0].head_deadline - time.monotonic(), 0.0))
        super().wait_for_and_dispatch_events(timeout)
