"""The client's retry, backoff and idempotency behaviour against a real local HTTP server."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from privrelease_client import ApiError, Client, ConnectionFailed

DROP = "drop"  # a scripted answer that closes the connection without a response


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Slow:
    """A scripted answer given only after ``seconds`` (past the client's read timeout)."""

    seconds: float
    reply: Any


@dataclass
class Script:
    """Answers given in order (the last one repeats) and every request that arrived."""

    answers: list[Any] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, seen: Seen) -> Any:
        with self.lock:
            self.seen.append(seen)
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None,
           content_type: str = "application/json") -> tuple[int, bytes, dict[str, str]]:
    raw = b"" if body is None else (body if isinstance(body, bytes) else
                                     json.dumps(body).encode())
    return status, raw, {"Content-Type": content_type, **(headers or {})}


def problem(status: int, code: str, detail: str, headers: dict[str, str] | None = None,
            **extra: Any) -> tuple[int, bytes, dict[str, str]]:
    doc = {"type": f"https://privrelease.dev/problems/{code}", "title": code, "status": status,
           "code": code, "detail": detail, **extra}
    return answer(status, doc, headers, content_type="application/problem+json")


@pytest.fixture()
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen = Seen(self.command, self.path, dict(self.headers.items()), body,
                        time.monotonic())
            reply = script.next(seen)
            if isinstance(reply, Slow):
                time.sleep(reply.seconds)
                reply = reply.reply
            if reply == DROP:
                self.close_connection = True
                return
            status, raw, headers = reply
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    finally:
        httpd.shutdown()
        httpd.server_close()


def closed_port() -> int:
    """A port nobody listens on: connecting is refused, nothing is ever sent."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client(url: str, **kw: Any) -> Client:
    return Client(url, "pr_test_key", backoff=0.02, **kw)


RELEASE: dict[str, Any] = {"dataset_id": "ds_1", "mechanism": "laplace",
           "params": {"statistic": "mean", "column": "x"}, "budget": {"epsilon": 0.5}}


def test_503_twice_then_202_resends_one_idempotency_key(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [problem(503, "unavailable", "job queue unavailable"),
                      problem(503, "unavailable", "job queue unavailable"),
                      answer(202, {"id": "rel_1", "status": "queued"})]
    doc = client(url).create_release("ds_1", "laplace", RELEASE["params"], {"epsilon": 0.5})
    assert doc == {"id": "rel_1", "status": "queued"}
    assert len(script.seen) == 3
    keys = {s.headers["Idempotency-Key"] for s in script.seen}
    assert len(keys) == 1 and uuid.UUID(keys.pop()).version == 4
    assert all(s.headers["Authorization"] == "Bearer pr_test_key" for s in script.seen)
    assert all(json.loads(s.body) == RELEASE for s in script.seen)


def test_each_post_has_its_own_key_and_gets_carry_none(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(200, {"id": "x"})]
    c = client(url)
    c.create_release("ds_1", "laplace", {}, {"epsilon": 1})
    c.create_release("ds_1", "laplace", {}, {"epsilon": 1}, idempotency_key="mine-1")
    c.get_release("rel_1")
    first, second, get = script.seen
    assert first.headers["Idempotency-Key"] not in {"", "mine-1"}
    assert second.headers["Idempotency-Key"] == "mine-1"
    assert "Idempotency-Key" not in get.headers and get.path == "/v1/releases/rel_1"


def test_429_waits_for_retry_after(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [problem(429, "rate_limited", "slow down", {"Retry-After": "1"}),
                      answer(201, {"id": "key_1"})]
    doc = client(url).create_key("analyst", label="a")
    assert doc == {"id": "key_1"}
    first, second = script.seen
    assert 1.0 <= second.at - first.at < 2.5
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]


def test_422_is_raised_at_once_with_code_and_field(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [problem(422, "validation_error", "unknown statistic",
                              field="params.statistic")]
    with pytest.raises(ApiError) as info:
        client(url).create_release("ds_1", "laplace", {"statistic": "median"}, {"epsilon": 1})
    err = info.value
    assert (err.status, err.code, err.field) == (422, "validation_error", "params.statistic")
    assert err.detail == "unknown statistic" and err.body["status"] == 422
    assert len(script.seen) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 500])
def test_other_errors_are_not_retried(server: tuple[str, Script], status: int) -> None:
    url, script = server
    script.answers = [problem(status, "some_code", "no", remaining=0.2)]
    with pytest.raises(ApiError) as info:
        client(url).create_key("analyst")
    assert (info.value.status, info.value.code, info.value.body["remaining"]) == (
        status, "some_code", 0.2)
    assert len(script.seen) == 1


def test_gives_up_after_the_retries_with_the_last_error(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [problem(502, "bad_gateway", "upstream down")]
    with pytest.raises(ApiError) as info:
        client(url, retries=2).list_datasets()
    assert (info.value.status, info.value.code) == (502, "bad_gateway")
    assert len(script.seen) == 3


def test_backoff_grows(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(504, b"<html>gateway timeout</html>", content_type="text/html")]
    with pytest.raises(ApiError) as info:
        Client(url, "k", retries=3, backoff=0.1).list_jobs()
    assert info.value.code == "gateway_timeout" and "gateway timeout" in info.value.detail
    gaps = [b.at - a.at for a, b in itertools.pairwise(script.seen)]
    # equal jitter: retry n waits between 0.5 and 1 times backoff * 2**n
    assert [round(g, 2) >= low for g, low in zip(gaps, [0.05, 0.1, 0.2], strict=True)] == [
        True] * 3
    assert gaps[0] < gaps[2]


def test_dropped_connection_is_retried_with_the_same_key(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [DROP, answer(200, {"id": "rel_1", "replayed": True})]
    doc = client(url).create_release("ds_1", "laplace", {}, {"epsilon": 1})
    assert doc["replayed"] is True
    first, second = script.seen
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]


def test_unreachable_server_raises_connection_failed() -> None:
    port = closed_port()
    with pytest.raises(ConnectionFailed) as info:
        client(f"http://127.0.0.1:{port}", retries=1).list_datasets()
    assert info.value.status == 0 and info.value.code == "connection_error"
    assert "pr_test_key" not in str(info.value)


def test_retry_after_too_long_is_raised_not_slept(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [problem(429, "rate_limited", "later", {"Retry-After": "3600"})]
    start = time.monotonic()
    with pytest.raises(ApiError) as info:
        client(url).list_datasets()
    assert info.value.status == 429 and time.monotonic() - start < 1
    assert len(script.seen) == 1


def test_wait_polls_until_a_final_status(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(200, {"id": "rel_1", "status": "queued"}),
                      answer(200, {"id": "rel_1", "status": "running"}),
                      answer(200, {"id": "rel_1", "status": "succeeded", "result": {"value": 1}})]
    polls: list[tuple[str, float]] = []
    doc = client(url).wait("rel_1", timeout=10, poll=0.01,
                           on_poll=lambda d, t: polls.append((d["status"], t)))
    assert doc["result"] == {"value": 1}
    assert [p[0] for p in polls] == ["queued", "running", "succeeded"]
    assert polls[0][1] <= polls[1][1] <= polls[2][1]


def test_wait_times_out(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(200, {"id": "rel_1", "status": "queued"})]
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="still queued"):
        client(url).wait("rel_1", timeout=0.3, poll=0.05)
    assert time.monotonic() - start < 1.5


def test_requests_match_the_contract(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(200, {}), answer(200, {}), answer(204), answer(200, {}),
                      answer(200, b'{"kind": "reserve"}\n{"kind": "commit"}\n',
                             content_type="application/x-ndjson")]
    c = client(url)
    c.set_budget("ds/1", caps={"epsilon": 5}, allocations={"key_1": {"epsilon": 1}})
    c.list_releases(dataset_id="ds_1", limit=5)
    c.revoke_key("key_1")
    c.cancel_job("rel_9")
    events = c.ledger("ds_1", kind="commit", jsonl=True)
    patch, lst, delete, cancel, ledger = script.seen
    assert (patch.method, patch.path) == ("PATCH", "/v1/datasets/ds%2F1/budget")
    assert json.loads(patch.body) == {"caps": {"epsilon": 5},
                                      "allocations": {"key_1": {"epsilon": 1}}}
    assert lst.path == "/v1/releases?dataset_id=ds_1&limit=5"
    assert (delete.method, delete.path) == ("DELETE", "/v1/keys/key_1")
    assert (cancel.method, cancel.path) == ("POST", "/v1/jobs/rel_9/cancel")
    assert "Idempotency-Key" in cancel.headers
    assert ledger.path == "/v1/datasets/ds_1/ledger?kind=commit&format=jsonl"
    assert events == [{"kind": "reserve"}, {"kind": "commit"}]


def test_upload_sends_multipart_and_verbatim_metadata(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(201, {"id": "ds_1"})]
    meta = '{"name": "a", "name": "b"}'  # the server, not the client, judges duplicates
    client(url).upload_dataset(b"x\n1\n", meta, filename="d.csv")
    (seen,) = script.seen
    assert seen.path == "/v1/datasets"
    assert seen.headers["Content-Type"].startswith("multipart/form-data")
    assert meta.encode() in seen.body and b'filename="d.csv"' in seen.body
    assert b"x\n1\n" in seen.body


def test_upload_is_resent_under_one_idempotency_key_after_a_lost_answer(
        server: tuple[str, Script]) -> None:
    """The server deduplicates uploads by Idempotency-Key, so a lost answer is retried."""
    url, script = server
    script.answers = [DROP, problem(502, "bad_gateway", "proxy lost the answer"),
                      answer(201, {"id": "ds_1"})]
    assert client(url).upload_dataset(b"x\n1\n", "{}", idempotency_key="mine") == {"id": "ds_1"}
    assert [s.headers["Idempotency-Key"] for s in script.seen] == ["mine"] * 3


def test_upload_is_retried_when_it_was_not_acted_on(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [problem(503, "unavailable", "busy"),
                      problem(429, "rate_limited", "slow down", {"Retry-After": "0"}),
                      answer(201, {"id": "ds_1"})]
    assert client(url).upload_dataset(b"x\n1\n", "{}") == {"id": "ds_1"}
    assert len(script.seen) == 3
    assert len({s.headers["Idempotency-Key"] for s in script.seen}) == 1
    assert all(b"x\n1\n" in s.body for s in script.seen)  # the whole body every time


def test_refused_connection_is_retried_even_for_uploads() -> None:
    port = closed_port()
    start = time.monotonic()
    with pytest.raises(ConnectionFailed):
        Client(f"http://127.0.0.1:{port}", "k", retries=2, backoff=0.2).upload_dataset(
            b"x\n1\n", "{}")
    assert time.monotonic() - start >= 0.3  # two backoff sleeps: 0.1-0.2 s, then 0.2-0.4 s


def test_a_read_timeout_repeats_reads_and_posts_but_not_patches(
        server: tuple[str, Script]) -> None:
    """The server may still be acting: a POST is repeated under its Idempotency-Key (the
    server answers the repeat with the first result), a PATCH is not repeated."""
    url, script = server
    script.answers = [Slow(0.6, answer(202, {"id": "rel_1"})), answer(202, {"id": "rel_1"})]
    doc = client(url, timeout=0.2).create_release("ds_1", "laplace", {}, {"epsilon": 1})
    assert doc == {"id": "rel_1"} and len(script.seen) == 2
    assert len({s.headers["Idempotency-Key"] for s in script.seen}) == 1
    script.seen.clear()
    script.answers = [Slow(0.6, answer(200, {"dataset_id": "ds_1"}))]
    with pytest.raises(ConnectionFailed, match="no answer"):
        client(url, timeout=0.2).request("PATCH", "/v1/datasets/ds_1/budget",
                                         json_body={"caps": {"epsilon": 2}})
    assert len(script.seen) == 1
