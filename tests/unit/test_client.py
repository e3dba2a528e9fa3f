"""privrelease-client against a real local HTTP server: retries, idempotency, paging,
release and analysis objects, budget errors; and its tables and plots."""

from __future__ import annotations

import email
import io
import itertools
import json
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from privrelease_client import (
    Analysis,
    ApiError,
    BudgetExhausted,
    BudgetRefused,
    Client,
    ConnectionFailed,
    MissingExtra,
    Progress,
    ReleaseFailed,
    frames,
    result_columns,
)
from privrelease_client import cli as client_cli

from service import ingest

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


def _file_part(seen: Seen) -> tuple[str, bytes]:
    """The multipart body's file part: its content type and bytes."""
    head = f"Content-Type: {seen.headers['Content-Type']}\r\n\r\n".encode()
    message = email.message_from_bytes(head + seen.body)
    for part in message.get_payload():  # type: ignore[union-attr]
        if part.get_param("name", header="content-disposition") == "file":
            return part.get_content_type(), part.get_payload(decode=True)
    raise AssertionError("no file part")


_UPLOAD_META = {"name": "t", "budgets": {}, "columns": {
    "age": {"type": "integer", "bounds": [0, 120], "allow_missing": True},
    "w": {"type": "continuous", "bounds": [0, 1]},
    "g": {"type": "categorical", "categories": ["a", "b"]}}}


def _stored(content: bytes) -> dict[str, list[Any]]:
    """What the server's ingest makes of an uploaded file (the real code)."""
    spec = ingest.parse_metadata(_UPLOAD_META)
    parts = list(ingest.iter_upload(content, spec, max_rows=100))
    return {name: np.concatenate([p[name] for p in parts]).tolist() for name in spec.columns}


_WANT = {"age": [30, 0, 7], "w": [0.1, 1 / 3, 1.0], "g": [0, 1, 0]}


def test_upload_sends_parquet_files_as_parquet(
        server: tuple[str, Script], tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    url, script = server
    script.answers = [answer(201, {"id": "ds_1"}), answer(201, {"id": "ds_2"})]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"age": [30, None, 7], "w": _WANT["w"], "g": ["a", "b", "a"]}),
                   path)
    client(url).upload_dataset(path, _UPLOAD_META)
    client(url).upload_dataset(b"age,w,g\n1,0.5,a\n", _UPLOAD_META)
    kind, content = _file_part(script.seen[0])
    assert (kind, content) == ("application/vnd.apache.parquet", path.read_bytes())
    assert b'filename="t.parquet"' in script.seen[0].body
    assert _stored(content) == _WANT
    assert _file_part(script.seen[1])[0] == "text/csv"


def test_upload_sends_pandas_and_polars_frames(
        server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch) -> None:
    """A DataFrame goes as Parquet (pandas through pyarrow, polars by itself), or, for
    pandas without pyarrow, as CSV; the server's ingest reads each back exactly."""
    import pandas as pd
    import polars as pl

    url, script = server
    script.answers = [answer(201, {"id": f"ds_{i}"}) for i in range(3)]
    frame = pd.DataFrame({"age": pd.array([30, None, 7], dtype="Int64"), "w": _WANT["w"],
                          "g": pd.Categorical(["a", "b", "a"])}, index=[5, 6, 7])
    client(url).upload_dataset(frame, _UPLOAD_META)
    client(url).upload_dataset(pl.from_pandas(frame), _UPLOAD_META)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    client(url).upload_dataset(frame, _UPLOAD_META)
    monkeypatch.undo()
    kinds = [_file_part(seen)[0] for seen in script.seen]
    assert kinds == ["application/vnd.apache.parquet"] * 2 + ["text/csv"]
    for seen in script.seen:
        assert _stored(_file_part(seen)[1]) == _WANT
    assert frames.frame_upload({"age": [1]}) is None


def test_cli_uploads_a_parquet_file(server: tuple[str, Script], tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    url, script = server
    script.answers = [answer(201, {"id": "ds_1", "name": "t", "n_rows": 3, "columns": {},
                                   "budgets": {}, "status": "active", "version": 1})]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"age": [30, None, 7], "w": _WANT["w"], "g": ["a", "b", "a"]}),
                   path)
    result = CliRunner().invoke(client_cli.cli, [
        "datasets", "upload", str(path), "--metadata-json", json.dumps(_UPLOAD_META),
        "--url", url, "--key", "pr_test_key"])
    assert result.exit_code == 0, result.output
    assert _file_part(script.seen[0]) == ("application/vnd.apache.parquet", path.read_bytes())


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


def test_an_estimate_answered_pricing_is_asked_again_until_answered(
        server: tuple[str, Script]) -> None:
    """Catches a client that returned the 202 ``pricing`` body as if it were the estimate
    (the cost needs a worker's precomputation): it waits ``retry_after`` and asks again."""
    url, script = server
    pricing = answer(202, {"status": "pricing", "mechanism": "m", "retry_after": 0.05},
                     {"Retry-After": "1"})
    done = {"mechanism": "m", "cost": {"epsilon": 1.0}, "accuracy": {}, "remaining": {}}
    script.answers = [pricing, pricing, answer(200, done)]
    assert client(url).estimate_release("ds_1", "m", {}, {"epsilon": 1}) == done
    assert len(script.seen) == 3
    script.answers = [pricing]
    with pytest.raises(TimeoutError):
        client(url).estimate_release("ds_1", "m", {}, {"epsilon": 1}, timeout=0.2)


# -- the notebook surface: env, pages, objects, frames, plots ----------------------------


def test_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                               server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(200, [])]
    monkeypatch.setenv("PRIVRELEASE_URL", url + "/")
    monkeypatch.setenv("PRIVRELEASE_KEY", "pr_from_env")
    c = Client()
    assert c.url == url and "pr_from_env" not in repr(c)
    c.list_datasets()
    assert script.seen[0].headers["Authorization"] == "Bearer pr_from_env"
    monkeypatch.delenv("PRIVRELEASE_KEY")
    with pytest.raises(ValueError, match="PRIVRELEASE_KEY"):
        Client()
    with pytest.raises(ValueError, match="http"):
        Client("ftp://x", "k")


def test_iter_releases_follows_the_cursor_to_the_last_page(
        server: tuple[str, Script]) -> None:
    """Catches a list that stops after the first page (the server pages by X-Next-Cursor),
    or one that reads the cursor only from X-Next-Cursor and not from Link."""
    url, script = server
    link = f'<{url}/v1/releases?limit=2&cursor=c%2B2>; rel="next"'
    script.answers = [answer(200, [{"id": "r1"}, {"id": "r2"}], {"X-Next-Cursor": "c1"}),
                      answer(200, [{"id": "r3"}], {"Link": link}),
                      answer(200, [{"id": "r4"}])]
    ids = [d["id"] for d in client(url).iter_releases(dataset_id="ds_1", page_size=2)]
    assert ids == ["r1", "r2", "r3", "r4"]
    assert [s.path for s in script.seen] == [
        "/v1/releases?dataset_id=ds_1&limit=2",
        "/v1/releases?dataset_id=ds_1&limit=2&cursor=c1",
        "/v1/releases?dataset_id=ds_1&limit=2&cursor=c%2B2"]


def test_ledger_follows_the_cursor_and_returns_every_event(
        server: tuple[str, Script]) -> None:
    """Catches ``ledger()`` returning the first page only (the server pages the audit log
    by X-Next-Cursor and Link since it is bounded per request): every event of every page,
    oldest first, the filters kept on each request; ``ledger_page`` gives one page and
    its cursor."""
    url, script = server
    link = f'<{url}/v1/datasets/ds_1/ledger?kind=commit&limit=2&cursor=c%2B2>; rel="next"'
    script.answers = [answer(200, [{"id": "1-0"}, {"id": "2-0"}], {"X-Next-Cursor": "c1"}),
                      answer(200, [], {"Link": link}),  # a page the filter emptied
                      answer(200, [{"id": "5-0"}])]
    events = client(url).ledger("ds_1", kind="commit", page_size=2)
    assert [e["id"] for e in events] == ["1-0", "2-0", "5-0"]
    assert [s.path for s in script.seen] == [
        "/v1/datasets/ds_1/ledger?kind=commit&limit=2",
        "/v1/datasets/ds_1/ledger?kind=commit&limit=2&cursor=c1",
        "/v1/datasets/ds_1/ledger?kind=commit&limit=2&cursor=c%2B2"]
    script.answers = [answer(200, [{"id": "9-0"}], {"X-Next-Cursor": "c9"})]
    page, cursor = client(url).ledger_page("ds_1", limit=1, cursor="c8")
    assert page == [{"id": "9-0"}] and cursor == "c9"
    assert script.seen[-1].path == "/v1/datasets/ds_1/ledger?limit=1&cursor=c8"


def test_a_repeated_cursor_ends_the_iteration(server: tuple[str, Script]) -> None:
    """A server bug answering the same cursor again must not loop for ever."""
    url, script = server
    script.answers = [answer(200, [{"id": "j1"}], {"X-Next-Cursor": "same"})]
    assert [d["id"] for d in client(url).iter_jobs(status="queued")] == ["j1", "j1"]
    assert len(script.seen) == 2 and script.seen[1].path.endswith("cursor=same")


def test_iter_analyses_follows_next_cursor(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(200, [{"id": "an_1"}], {"X-Next-Cursor": "k"}),
                      answer(200, [{"id": "an_2"}])]
    assert [a["id"] for a in client(url).iter_analyses("rel_1", page_size=1)] == [
        "an_1", "an_2"]
    assert script.seen[1].path == "/v1/releases/rel_1/analyses?limit=1&cursor=k"


def test_budget_exhausted_is_its_own_class_with_the_amounts(
        server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [problem(409, "budget_exhausted", "not enough", measure="epsilon",
                              scope="dataset", requested=0.5, remaining=0.125)]
    with pytest.raises(BudgetExhausted) as info:
        client(url).submit("ds_1", "laplace", {}, {"epsilon": 0.5})
    err = info.value
    assert isinstance(err, ApiError) and err.status == 409
    assert (err.measure, err.scope, err.requested, err.remaining) == (
        "epsilon", "dataset", 0.5, 0.125)


def test_release_wait_goes_through_pricing_and_returns_itself(
        server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(202, {"id": "rel_1", "status": "pricing"}),
                      answer(200, {"id": "rel_1", "status": "pricing"}),
                      answer(200, {"id": "rel_1", "status": "queued"}),
                      answer(200, {"id": "rel_1", "status": "succeeded",
                                   "result": {"value": 2.5}, "cost": {"epsilon": 1}})]
    seen: list[str] = []
    release = client(url).submit("ds_1", "laplace", {}, {"epsilon": 1})
    assert release.status == "pricing" and not release.done
    assert release.wait(timeout=10, poll=0.01,
                        progress=lambda d, _t: seen.append(d["status"])) is release
    assert seen == ["pricing", "queued", "succeeded"]
    assert release.result == {"value": 2.5} and release.cost == {"epsilon": 1}


def test_a_release_failed_in_pricing_raises_with_code_and_amounts(
        server: tuple[str, Script]) -> None:
    """Pricing ends in ``failed`` with the problem in ``error``; wait() must not report
    success, and the exception carries the amounts the server computed."""
    url, script = server
    failed = {"id": "rel_1", "status": "failed", "error": {
        "code": "budget_exhausted", "message": "the computed cost exceeds what remains",
        "measure": "interval_leakage", "requested": 0.8, "remaining": 0.3}}
    script.answers = [answer(200, {"id": "rel_1", "status": "pricing"}), answer(200, failed)]
    release = client(url).release("rel_1")
    with pytest.raises(ReleaseFailed) as info:
        release.wait(timeout=10, poll=0.01, progress=False)
    err = info.value
    assert (err.code, err.requested, err.remaining, err.measure) == (
        "budget_exhausted", 0.8, 0.3, "interval_leakage")
    # the refusal a retry would get at the POST: one ``except BudgetExhausted`` catches both
    assert isinstance(err, BudgetExhausted) and isinstance(err, BudgetRefused)
    assert err.doc["status"] == "failed" and release.status == "failed"
    assert release.wait(timeout=1, progress=False, check=False).status == "failed"
    assert len(script.seen) == 2  # an ended release is not polled again


def test_analysis_object_waits_and_cancels(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [answer(202, {"id": "an_1", "release_id": "rel_1", "analysis": "npmle",
                                   "status": "queued"}),
                      answer(200, {"id": "an_1", "release_id": "rel_1", "status": "running"}),
                      answer(200, {"id": "an_1", "release_id": "rel_1",
                                   "status": "cancelled", "error": {"code": "cancelled"}})]
    c = client(url)
    a = Analysis(c, c.analyze("rel_1", "npmle"))
    assert (a.id, a.release_id, a.name) == ("an_1", "rel_1", "npmle")
    assert a.refresh().status == "running"
    with pytest.raises(ReleaseFailed, match="cancelled") as info:
        a.wait(timeout=5, poll=0.01, progress=False)
    assert not isinstance(info.value, BudgetExhausted)  # only a budget refusal is one
    assert [s.path for s in script.seen] == [
        "/v1/releases/rel_1/analyses", "/v1/releases/rel_1/analyses/an_1",
        "/v1/releases/rel_1/analyses/an_1"]
    script.answers = [answer(200, {"id": "an_1", "release_id": "rel_1",
                                   "status": "cancelled"})]
    a.cancel()
    assert script.seen[-1].method == "POST" and script.seen[-1].path.endswith("/cancel")
    assert "Idempotency-Key" in script.seen[-1].headers


def test_plot_and_ledger_export_keep_the_bytes(server: tuple[str, Script],
                                               tmp_path: Path) -> None:
    url, script = server
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    lines = b'{"kind": "cap"}\n{"kind": "reserve"}\n'
    script.answers = [answer(200, png, content_type="image/png"),
                      answer(200, lines, content_type="application/x-ndjson"),
                      answer(200, {"id": "rel_1", "status": "succeeded"}),
                      answer(200, png, content_type="image/png")]
    c = client(url)
    assert c.release_plot("rel_1") == png
    assert c.export_ledger("ds_1", kind=["cap", "reserve"]) == lines.decode()
    assert script.seen[1].path == "/v1/datasets/ds_1/ledger?kind=cap%2Creserve&format=jsonl"
    assert c.release("rel_1").plot(tmp_path / "r.png") == tmp_path / "r.png"
    assert (tmp_path / "r.png").read_bytes() == png
    assert script.seen[0].headers["Accept"] == "image/png"


def test_progress_is_one_carriage_return_line_on_a_tty_and_silent_otherwise() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        p = Progress(stream)
        p({"id": "rel_1", "status": "pricing"}, 0.25)
        p({"id": "rel_1", "status": "running\x1b[31m"}, 1.5)
        p.clear()
    assert pipe.getvalue() == ""
    assert tty.getvalue() == ("\r| rel_1 pricing  0.2s\x1b[K\r/ rel_1 running?[31m  1.5s"
                              "\x1b[K\r\x1b[K")


# -- results as tables -------------------------------------------------------------------

def test_result_columns_shapes() -> None:
    """Exact columns for each result shape the mechanisms produce."""
    assert result_columns({"value": 0.5, "n": 3}) == {"value": [0.5], "n": [3]}
    assert result_columns({"values": [1, 2], "categories": ["a", "b"], "total": 3}) == {
        "categories": ["a", "b"], "values": [1, 2]}
    assert result_columns({"values": [1, 2], "bins": [0, 0.5, 1]}) == {
        "left": [0, 0.5], "right": [0.5, 1], "values": [1, 2]}
    assert result_columns({"grid": [0, 1], "values": [3, 4], "lower": [2, 3],
                           "upper": [4, 5], "coefficients": [9]}) == {
        "grid": [0, 1], "values": [3, 4], "lower": [2, 3], "upper": [4, 5]}
    assert result_columns({"cells": [[0, 1], [1, 2]], "mass": [0.25, 0.75],
                           "tail_mass": {"below": 0.0}}) == {
        "cells_left": [0, 1], "cells_right": [1, 2], "mass": [0.25, 0.75]}
    assert result_columns({"records": [{"a": 1}, {"a": 2, "b": 3}]}) == {
        "a": [1, 2], "b": [None, 3]}
    assert result_columns({"ci": {"low": 1, "high": 2}}) == {"ci.low": [1], "ci.high": [2]}
    assert result_columns(7) == {"value": [7]}


@given(st.dictionaries(
    st.text(min_size=1, max_size=5),
    st.one_of(st.floats(allow_nan=False), st.text(max_size=3), st.none(),
              st.lists(st.integers(), max_size=4),
              st.lists(st.lists(st.integers(), min_size=2, max_size=2), max_size=3)),
    max_size=6))
@settings(max_examples=200, deadline=None)
def test_result_columns_are_always_a_rectangle(result: dict[str, Any]) -> None:
    cols = result_columns(result)
    assert len({len(v) for v in cols.values()}) <= 1


def test_to_pandas_and_to_polars_agree(server: tuple[str, Script]) -> None:
    url, script = server
    doc = {"id": "rel_1", "status": "succeeded",
           "result": {"values": [1.5, 2.5], "categories": ["u", "v"]}}
    script.answers = [answer(200, doc),
                      answer(200, b"x,g\n0.5,u\n1.0,v\n", content_type="text/csv")]
    release = client(url).release("rel_1")
    frame = release.to_pandas()
    assert list(frame.columns) == ["categories", "values"]
    assert frame["values"].tolist() == [1.5, 2.5]
    assert release.to_polars().to_dict(as_series=False) == {
        "categories": ["u", "v"], "values": [1.5, 2.5]}
    table = release.data()
    assert table.rows == 2 and script.seen[-1].headers["Accept"] == "text/csv"
    assert table.to_pandas()["g"].tolist() == ["u", "v"]
    assert table.to_polars()["x"].to_list() == [0.5, 1.0]


def test_a_missing_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "polars", None)  # as if it were not installed
    with pytest.raises(MissingExtra, match=r"privrelease-client\[polars\]"):
        frames.to_polars({"value": 1})
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match=r"privrelease-client\[plot\]"):
        frames.plot_result({"values": [1], "grid": [0]})


def test_plot_result_draws_bands_bars_and_steps() -> None:
    import matplotlib

    matplotlib.use("Agg")
    ax = frames.plot_result({"grid": [0.0, 0.5, 1.0], "values": [1.0, 2.0, 1.0],
                             "lower": [0.5, 1.5, 0.5], "upper": [1.5, 2.5, 1.5]},
                            title="kde")
    assert ax.lines[0].get_ydata().tolist() == [1.0, 2.0, 1.0]
    assert len(ax.collections) == 1 and ax.get_title() == "kde"  # the 95 % band
    bars = frames.plot_result({"values": [3, 5], "categories": ["a", "b"],
                               "lower": [2, 4], "upper": [4, 7]})
    assert [p.get_height() for p in bars.patches] == [3, 5]
    from matplotlib.container import ErrorbarContainer

    bar_errors = next(c for c in bars.containers if isinstance(c, ErrorbarContainer))
    (segments,) = bar_errors.lines[2]  # each bar's error bar spans its band
    assert [seg[:, 1].tolist() for seg in segments.get_segments()] == [[2, 4], [4, 7]]
    steps = frames.plot_result({"cells": [[0, 1], [1, 2]], "cdf": [0.25, 1.0],
                                "mass": [0.25, 0.75]})
    assert steps.get_ylabel() == "CDF" and steps.lines[0].get_ydata().tolist() == [0.25, 1.0]
    with pytest.raises(ValueError, match="no values"):
        frames.plot_result({"value": 1})


def test_cli_wait_reports_a_pricing_failure_with_its_amounts(
        server: tuple[str, Script]) -> None:
    """A release whose pricing job finds the cost too large ends ``failed`` with code
    ``budget_exhausted``: the CLI must exit 1 and print the amounts, not just "failed"."""
    url, script = server
    error = {"code": "budget_exhausted", "message": "the computed cost exceeds what remains",
             "measure": "interval_leakage", "scope": "dataset", "requested": 0.8,
             "remaining": 0.3}
    script.answers = [answer(202, {"id": "rel_1", "status": "pricing"}),
                      answer(200, {"id": "rel_1", "status": "pricing"}),
                      answer(200, {"id": "rel_1", "status": "failed", "error": error})]
    result = CliRunner().invoke(client_cli.cli, [
        "release", "create", "--dataset", "ds_1", "--mechanism", "interval.case1",
        "--budget", "interval_leakage=0.8", "--wait", "--url", url, "--key", "pr_test_key"])
    assert result.exit_code == 1
    assert re.search(r"^status:\s+failed$", result.stdout, re.MULTILINE), result.stdout
    assert result.stderr.splitlines() == [
        "error: release_failed: budget_exhausted: the computed cost exceeds what remains",
        "  requested: 0.8 interval_leakage, remaining: 0.3 interval_leakage (dataset budget)"]
    assert [s.method for s in script.seen] == ["POST", "GET", "GET"]


def _form_fields(seen: Seen) -> dict[str, str]:
    """The multipart body's text fields (every part but the file)."""
    head = f"Content-Type: {seen.headers['Content-Type']}\r\n\r\n".encode()
    message = email.message_from_bytes(head + seen.body)
    return {str(part.get_param("name", header="content-disposition")):
            part.get_payload(decode=True).decode()
            for part in message.get_payload()  # type: ignore[union-attr]
            if part.get_param("name", header="content-disposition") != "file"}


def test_version_calls_match_the_contract(server: tuple[str, Script]) -> None:
    """Catches a version call on the wrong path or method, a form field the server does
    not read (metadata omitted must stay omitted: the dataset's is then used), and a
    release or estimate that drops ``version``."""
    url, script = server
    script.answers = [answer(201, {"version": 2}), answer(201, {"version": 3}),
                      answer(200, []), answer(200, {}), answer(200, {}), answer(200, {}),
                      answer(202, {"id": "rel_1"}), answer(200, {"cost": {}})]
    c = client(url)
    c.upload_version("ds/1", b"x\n1\n", filename="v.csv")
    c.upload_version("ds_1", b"x\n2\n", {"name": "t"}, compatible=True, make_current=True,
                     idempotency_key="k-1")
    c.list_versions("ds_1")
    c.get_version("ds_1", 2)
    c.set_current_version("ds_1", 2)
    c.retire_version("ds_1", 1)
    c.create_release("ds_1", "laplace", {}, {"epsilon": 1}, version=2)
    c.estimate_release("ds_1", "laplace", {}, {"epsilon": 1}, version=1)
    up1, up2, lst, one, cur, ret, rel, est = script.seen
    assert (up1.method, up1.path) == ("POST", "/v1/datasets/ds%2F1/versions")
    assert _form_fields(up1) == {"compatible": "false", "make_current": "false"}
    assert _file_part(up1) == ("text/csv", b"x\n1\n")
    assert _form_fields(up2) == {"compatible": "true", "make_current": "true",
                                 "metadata": '{"name": "t"}'}
    assert up2.headers["Idempotency-Key"] == "k-1"
    assert (lst.method, lst.path) == ("GET", "/v1/datasets/ds_1/versions")
    assert (one.method, one.path) == ("GET", "/v1/datasets/ds_1/versions/2")
    assert (cur.method, cur.path, json.loads(cur.body)) == (
        "PATCH", "/v1/datasets/ds_1/versions/2", {"current": True})
    assert (ret.method, ret.path, json.loads(ret.body)) == (
        "PATCH", "/v1/datasets/ds_1/versions/1", {"status": "retired"})
    assert json.loads(rel.body)["version"] == 2 and json.loads(est.body)["version"] == 1


def test_registrations_by_reference_match_the_contract(server: tuple[str, Script]) -> None:
    """Catches a registration by reference sent as a form, on the wrong path, or with the
    metadata's columns reordered (their order is the dataset's)."""
    url, script = server
    script.answers = [answer(201, {"id": "ds_1"}), answer(201, {"version": 2})]
    c = client(url)
    meta = {"name": "t", "columns": {"z": {"type": "integer"}, "a": {"type": "integer"}}}
    c.register_dataset("s3://b/exports/people", meta, idempotency_key="k-2")
    c.register_version("ds/1", "file:///srv/x.parquet", make_current=True)
    first, second = script.seen
    assert (first.method, first.path) == ("POST", "/v1/datasets")
    assert first.headers["Content-Type"] == "application/json"
    assert first.headers["Idempotency-Key"] == "k-2"
    assert list(json.loads(first.body)["metadata"]["columns"]) == ["z", "a"]
    assert json.loads(first.body) == {"source": "s3://b/exports/people", "metadata": meta}
    assert (second.method, second.path) == ("POST", "/v1/datasets/ds%2F1/versions")
    assert json.loads(second.body) == {"source": "file:///srv/x.parquet",
                                       "compatible": False, "make_current": True}


def test_cli_datasets_versions(server: tuple[str, Script], tmp_path: Path) -> None:
    """Catches a ``datasets versions`` subcommand that calls the wrong route or drops a
    flag, and ``--dataset-version`` not reaching the release request."""
    url, script = server
    version = {"dataset_id": "ds_1", "version": 2, "current": True, "status": "active",
               "n_rows": 3, "sha256": "ab" * 32, "columns": {}}
    script.answers = [answer(201, version), answer(200, [version]), answer(200, version),
                      answer(200, {**version, "version": 1, "status": "retired"}),
                      answer(202, {"id": "rel_1", "status": "queued"})]
    data = tmp_path / "v.csv"
    data.write_text("x\n1\n")
    auth = ["--url", url, "--key", "pr_test_key"]
    runs = [["datasets", "versions", "upload", "ds_1", str(data), "--make-current"],
            ["datasets", "versions", "list", "ds_1"],
            ["datasets", "versions", "current", "ds_1", "2"],
            ["datasets", "versions", "retire", "ds_1", "1"],
            ["release", "create", "--dataset", "ds_1", "--mechanism", "laplace",
             "--budget", "epsilon=1", "--dataset-version", "2"]]
    outputs = []
    for args in runs:
        result = CliRunner().invoke(client_cli.cli, [*args, *auth])
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout)
    upload, lst, cur, ret, rel = script.seen
    assert _form_fields(upload) == {"compatible": "false", "make_current": "true"}
    assert (lst.method, lst.path) == ("GET", "/v1/datasets/ds_1/versions")
    assert (cur.method, json.loads(cur.body)) == ("PATCH", {"current": True})
    assert (ret.path, json.loads(ret.body)) == ("/v1/datasets/ds_1/versions/1",
                                                {"status": "retired"})
    assert json.loads(rel.body)["version"] == 2
    assert re.search(r"^version:\s+2$", outputs[0], re.MULTILINE), outputs[0]
    assert "abababababab" in outputs[1]
    result = CliRunner().invoke(client_cli.cli, [
        "datasets", "versions", "upload", "ds_1", str(data), "--metadata-json", "{}",
        "--metadata", str(data), *auth])
    assert result.exit_code == 2 and len(script.seen) == 5


def test_the_client_distribution_stands_alone() -> None:
    """The server may depend on the client, never the other way: the client's code
    imports nothing of ours; its dependencies are requests and, for its command line
    only, click and rich (the rest are extras)."""
    import ast
    import tomllib

    root = Path(__file__).resolve().parents[2] / "client"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["name"] == "privrelease-client"
    assert project["dependencies"] == ["requests>=2.31", "click>=8.1", "rich>=13.0"]
    assert set(project["optional-dependencies"]) == {"pandas", "polars", "plot", "parquet"}
    imported: set[str] = set()
    for path in (root / "src" / "privrelease_client").glob("*.py"):
        here: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                here.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                here.add(node.module.split(".")[0])
        if path.name not in {"cli.py", "terminal.py"}:  # the command line's modules
            assert not here & {"click", "rich"}, path
        imported |= here
    assert not imported & {"service", "workers", "mechanisms", "flask", "numpy"}, imported
    assert {"requests", "privrelease_client"} <= imported


def test_a_notebook_shows_fields_and_result_rows_escaped() -> None:
    """Catches markup from the server (a label) reaching the notebook unescaped."""
    from privrelease_client import Release

    doc = {"id": "rel_1", "status": "succeeded", "mechanism": "<script>x</script>",
           "cost": {"epsilon": 0.5},
           "result": {"values": list(range(25)), "grid": [i / 24 for i in range(25)]}}
    page = Release(Client("http://127.0.0.1:1", "k"), doc)._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "<td style='text-align:left'>{&quot;epsilon&quot;: 0.5}</td>" in page
    assert "<th>grid</th><th>values</th>" in page
    assert page.count("<tr><td>") == 20 and "<p>5 more rows: to_pandas()</p>" in page


def test_list_and_get_dataset_send_expand_only_when_asked(server: tuple[str, Script]) -> None:
    """Catches ``expand`` not reaching the query (the server would answer versions
    without their columns), or an ``expand=`` sent when none was asked."""
    url, script = server
    script.answers = [answer(200, []), answer(200, []), answer(200, {"id": "ds_1"}),
                      answer(200, {"id": "ds_1"})]
    c = client(url)
    c.list_datasets()
    c.list_datasets(expand="versions")
    c.get_dataset("ds_1", expand=["versions"])
    c.get_dataset("ds_1")
    assert [s.path for s in script.seen] == [
        "/v1/datasets", "/v1/datasets?expand=versions",
        "/v1/datasets/ds_1?expand=versions", "/v1/datasets/ds_1"]
