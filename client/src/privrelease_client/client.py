"""The privrelease HTTP API (v1) for one server and one key: one method per route.

Calls are retried only where that is safe: on connection errors, 502/503/504 and 429
(after ``Retry-After``), never on other 4xx, and every POST carries one
``Idempotency-Key`` for all its attempts so the server can answer a retry with the first
result instead of acting twice (a release, or a dataset upload: a second copy would
bring a second budget). Lists that the server pages (releases, jobs, analyses, the
ledger) come whole through the ``iter_*`` methods, which follow the cursor.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import requests

from privrelease_client import frames
from privrelease_client._version import __version__
from privrelease_client.errors import ApiError, ConnectionFailed
from privrelease_client.objects import TERMINAL, Analysis, Release

__all__ = ["DEFAULT_URL", "Client"]

DEFAULT_URL = "http://127.0.0.1:8000"
#: statuses worth another attempt: rate limited, overloaded, or a proxy lost the upstream
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: after a read timeout the server may still be acting on the call: repeat reads, and
#: POSTs, whose Idempotency-Key makes the server answer a repeat with the first result
_SAFE = frozenset({"GET", "HEAD", "POST"})
_ANALYSIS_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

Json = Any
#: a path (.csv or .parquet), the file's bytes, a binary file, or a pandas/polars DataFrame
FileArg = str | os.PathLike[str] | bytes | IO[bytes] | Any


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _is_parquet(content: bytes) -> bool:
    """Parquet's magic bytes at both ends (what the server checks too)."""
    return len(content) >= 12 and content[:4] == content[-4:] == b"PAR1"


def _seg(value: str) -> str:
    """One path segment: an id can never reach another endpoint (``../keys``)."""
    return quote(str(value), safe="")


def _expand(expand: str | Sequence[str] | None) -> str | None:
    """``expand`` as the query's comma-separated list (None: left out)."""
    if expand is None or isinstance(expand, str):
        return expand
    return ",".join(expand) or None  # an empty list expands nothing: left out


class Client:
    """The privrelease API for one server and one key.

    ``url`` and ``key`` default to ``PRIVRELEASE_URL`` (else ``DEFAULT_URL``) and
    ``PRIVRELEASE_KEY``. ``retries`` is the number of extra attempts after the first;
    waits grow as ``backoff * 2**n`` (with jitter, at most ``max_backoff``) or follow
    ``Retry-After`` up to ``max_retry_after`` seconds; a longer ``Retry-After`` is
    raised at once rather than blocking the caller for minutes.
    """

    def __init__(self, url: str | None = None, key: str | None = None, *,
                 timeout: float = 30.0, retries: int = 3,
                 session: requests.Session | None = None, backoff: float = 0.5,
                 max_backoff: float = 8.0, max_retry_after: float = 60.0) -> None:
        url = url or os.environ.get("PRIVRELEASE_URL") or DEFAULT_URL
        key = key or os.environ.get("PRIVRELEASE_KEY")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server URL must start with http:// or https://, not {url!r}")
        if not key:
            raise ValueError("no API key: pass key= or set PRIVRELEASE_KEY")
        self.url = url.rstrip("/")
        self._key = key
        self.timeout = timeout
        self.retries = max(retries, 0)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._own_session = session is None
        self.session = session or requests.Session()

    def __repr__(self) -> str:  # never the key
        return f"Client({self.url!r})"

    def close(self) -> None:
        if self._own_session:
            self.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------

    def _delay(self, attempt: int) -> float:
        """Exponential backoff with "equal jitter": spreads retrying clients apart."""
        step: float = min(self.max_backoff, self.backoff * 2**attempt)
        return step / 2 + random.uniform(0, step / 2)

    def send(self, method: str, path: str, *, json_body: Json = None,
             params: Mapping[str, Any] | None = None,
             files: Mapping[str, Any] | None = None, data: Mapping[str, Any] | None = None,
             idempotency_key: str | None = None,
             accept: str = "application/json") -> requests.Response:
        """One API call with retries; the successful (2xx) response, else ``ApiError``."""
        method = method.upper()
        headers = {"Authorization": f"Bearer {self._key}", "Accept": accept,
                   "User-Agent": f"privrelease-client/{__version__}"}
        if method == "POST":
            headers["Idempotency-Key"] = idempotency_key or str(uuid.uuid4())
        query = {k: v for k, v in (params or {}).items() if v is not None}
        attempt = 0
        while True:
            wait: float | None = None  # None: give up and raise
            try:
                resp = self.session.request(
                    method, self.url + path, headers=headers, json=json_body, params=query,
                    files=files, data=data, timeout=self.timeout, allow_redirects=False)
            except requests.ConnectionError as err:  # includes ConnectTimeout
                if attempt < self.retries:
                    wait = self._delay(attempt)
                if wait is None:
                    raise ConnectionFailed(
                        f"cannot reach {self.url}: {type(err).__name__}") from err
            except requests.Timeout as err:  # a read timeout: the call may be under way
                if attempt < self.retries and method in _SAFE:
                    wait = self._delay(attempt)
                if wait is None:
                    raise ConnectionFailed(
                        f"no answer from {self.url} within {self.timeout:g} s") from err
            else:
                status = resp.status_code
                if 200 <= status < 300:
                    return resp
                after = _retry_after(resp.headers.get("Retry-After"))
                if (status in RETRY_STATUSES and attempt < self.retries
                        and (after is None or after <= self.max_retry_after)):
                    wait = max(self._delay(attempt), after or 0.0)
                if wait is None:
                    raise ApiError.from_response(resp)
            time.sleep(wait)
            attempt += 1

    def request(self, method: str, path: str, *, json_body: Json = None,
                params: Mapping[str, Any] | None = None,
                files: Mapping[str, Any] | None = None, data: Mapping[str, Any] | None = None,
                idempotency_key: str | None = None, raw: bool = False) -> Any:
        """Send one API call with retries; the parsed JSON (None for 204, text if ``raw``)."""
        resp = self.send(method, path, json_body=json_body, params=params, files=files,
                         data=data, idempotency_key=idempotency_key)
        if resp.status_code == 204 or not resp.content:
            return None
        if raw:
            return resp.text
        try:
            return resp.json()
        except ValueError:  # e.g. a captive portal's HTML page
            raise ApiError(resp.status_code, "invalid_response", "the answer is not JSON",
                           None, {}) from None

    def _get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def _pages(self, path: str, params: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """Every item of a list paged by ``X-Next-Cursor`` (the ``Link`` header's twin)."""
        query = dict(params)
        seen: set[str] = set()
        while True:
            resp = self.send("GET", path, params=query)
            yield from resp.json()
            cursor = resp.headers.get("X-Next-Cursor") or _link_cursor(resp)
            if not cursor or cursor in seen:  # a repeated cursor would loop for ever
                return
            seen.add(cursor)
            query["cursor"] = cursor

    # -- datasets --------------------------------------------------------------------

    def upload_dataset(self, file: FileArg, metadata: str | Mapping[str, Any],
                       *, filename: str | None = None,
                       idempotency_key: str | None = None) -> dict[str, Any]:
        """Register a dataset with its metadata (JSON text or dict).

        ``file`` is a CSV or Parquet file (path, bytes or binary file; the server tells
        them apart by Parquet's magic bytes, and the part's type says which it is), or
        a pandas or polars DataFrame, sent as Parquet (CSV for pandas without pyarrow;
        see ``frames.frame_upload``). Metadata text is sent verbatim so the server, not
        json.loads here, judges it (it refuses duplicate keys, which a dict would
        silently merge). Retries resend the whole body under one ``Idempotency-Key``:
        the server answers them with the dataset the first attempt registered. Pass
        your own key to make a retry across process restarts safe.
        """
        meta = metadata if isinstance(metadata, str) else json.dumps(metadata)
        doc: dict[str, Any] = self.request(
            "POST", "/v1/datasets", files={"file": _file_part(file, filename)},
            data={"metadata": meta}, idempotency_key=idempotency_key)
        return doc

    def upload_version(self, dataset_id: str, file: FileArg,
                       metadata: str | Mapping[str, Any] | None = None, *,
                       compatible: bool = False, make_current: bool = False,
                       filename: str | None = None,
                       idempotency_key: str | None = None) -> dict[str, Any]:
        """Upload the next version of a dataset: the same people, the dataset's budget.

        ``file`` as for ``upload_dataset``. Without ``metadata`` the dataset's schema is
        used; changed metadata needs ``compatible=True`` (same columns and kinds; bounds
        and categories may change; budgets, notions and policies are the dataset's). The
        version becomes current only with ``make_current=True``. Returns the version.
        """
        data = {"compatible": str(compatible).lower(),
                "make_current": str(make_current).lower()}
        if metadata is not None:
            data["metadata"] = metadata if isinstance(metadata, str) else json.dumps(metadata)
        doc: dict[str, Any] = self.request(
            "POST", f"/v1/datasets/{_seg(dataset_id)}/versions",
            files={"file": _file_part(file, filename)}, data=data,
            idempotency_key=idempotency_key)
        return doc

    def register_dataset(self, source: str, metadata: Mapping[str, Any], *,
                         idempotency_key: str | None = None) -> dict[str, Any]:
        """Register a dataset by reference to Parquet already in storage: ``source`` is
        the storage URL of a Parquet file or of a folder (prefix) of them
        (``s3://bucket/prefix``, ``file:///path``) under a root the server allows
        (``PRIVRELEASE_SOURCE_ROOTS``). The server reads it once and stores a copy."""
        doc: dict[str, Any] = self.request(
            "POST", "/v1/datasets", json_body={"source": source, "metadata": dict(metadata)},
            idempotency_key=idempotency_key)
        return doc

    def register_version(self, dataset_id: str, source: str,
                         metadata: Mapping[str, Any] | None = None, *,
                         compatible: bool = False, make_current: bool = False,
                         idempotency_key: str | None = None) -> dict[str, Any]:
        """The next version of a dataset by reference (``source`` as for
        ``register_dataset``; the rest as for ``upload_version``)."""
        body: dict[str, Any] = {"source": source, "compatible": compatible,
                                "make_current": make_current}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        doc: dict[str, Any] = self.request(
            "POST", f"/v1/datasets/{_seg(dataset_id)}/versions", json_body=body,
            idempotency_key=idempotency_key)
        return doc

    def list_versions(self, dataset_id: str) -> list[dict[str, Any]]:
        """Every version of the dataset, oldest first (``current`` marks the current one)."""
        docs: list[dict[str, Any]] = self._get(f"/v1/datasets/{_seg(dataset_id)}/versions")
        return docs

    def get_version(self, dataset_id: str, version: int) -> dict[str, Any]:
        doc: dict[str, Any] = self._get(
            f"/v1/datasets/{_seg(dataset_id)}/versions/{int(version)}")
        return doc

    def set_current_version(self, dataset_id: str, version: int) -> dict[str, Any]:
        """Releases without a ``version`` use this one from now on."""
        doc: dict[str, Any] = self.request(
            "PATCH", f"/v1/datasets/{_seg(dataset_id)}/versions/{int(version)}",
            json_body={"current": True})
        return doc

    def retire_version(self, dataset_id: str, version: int) -> dict[str, Any]:
        """No new releases on this version (not the current one; 409 if it is); its
        releases stay readable and its files are kept."""
        doc: dict[str, Any] = self.request(
            "PATCH", f"/v1/datasets/{_seg(dataset_id)}/versions/{int(version)}",
            json_body={"status": "retired"})
        return doc

    def list_datasets(self, *, expand: str | Sequence[str] | None = None
                      ) -> list[dict[str, Any]]:
        """Every dataset this key may see, newest first (``iter_datasets``, collected).
        Their ``versions`` entries come without ``columns`` unless ``expand="versions"``
        (``list_versions`` has them)."""
        return list(self.iter_datasets(expand=expand))

    def iter_datasets(self, *, expand: str | Sequence[str] | None = None,
                      page_size: int | None = None) -> Iterator[dict[str, Any]]:
        """Every dataset this key may see, newest first, fetched a page at a time."""
        return self._pages("/v1/datasets", {"expand": _expand(expand), "limit": page_size})

    def dummy_rows(self, dataset_id: str, *, rows: int | None = None,
                   seed: int | None = None) -> str:
        """Dummy rows of the dataset as CSV text, drawn by the server from its public
        metadata only (not data, free of budget): to write and test requests and local
        code against (``frames.csv_to_pandas`` reads it)."""
        resp = self.send("GET", f"/v1/datasets/{_seg(dataset_id)}/dummy.csv",
                         params={"rows": rows, "seed": seed}, accept="text/csv")
        return resp.text

    def get_dataset(self, dataset_id: str, *, expand: str | Sequence[str] | None = None
                    ) -> dict[str, Any]:
        """One dataset; ``versions`` entries with ``columns`` only if
        ``expand="versions"``."""
        doc: dict[str, Any] = self._get(f"/v1/datasets/{_seg(dataset_id)}",
                                        expand=_expand(expand))
        return doc

    def retire_dataset(self, dataset_id: str) -> dict[str, Any]:
        """DELETE: the dataset is retired (kept for audit, no new releases)."""
        doc: dict[str, Any] = self.request("DELETE", f"/v1/datasets/{_seg(dataset_id)}")
        return doc

    def get_budget(self, dataset_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self._get(f"/v1/datasets/{_seg(dataset_id)}/budget")
        return doc

    def set_budget(self, dataset_id: str, *, caps: Mapping[str, float] | None = None,
                   allocations: Mapping[str, Mapping[str, float]] | None = None
                   ) -> dict[str, Any]:
        """PATCH caps and/or per-key allocations; 409 ``cap_below_spent`` if too low."""
        body: dict[str, Any] = {}
        if caps is not None:
            body["caps"] = dict(caps)
        if allocations is not None:
            body["allocations"] = {k: dict(v) for k, v in allocations.items()}
        doc: dict[str, Any] = self.request(
            "PATCH", f"/v1/datasets/{_seg(dataset_id)}/budget", json_body=body)
        return doc

    @staticmethod
    def _ledger_query(kind: str | Sequence[str] | None, since: str | None,
                      until: str | None) -> dict[str, Any]:
        kinds = kind if kind is None or isinstance(kind, str) else ",".join(kind)
        return {"kind": kinds, "since": since, "until": until}

    def ledger(self, dataset_id: str, *, kind: str | Sequence[str] | None = None,
               since: str | None = None, until: str | None = None,
               jsonl: bool = False, page_size: int | None = None) -> Any:
        """Every audit event, oldest first, following the cursor page by page; with
        ``jsonl`` the server streams lines, parsed here into a list."""
        if not jsonl:
            return list(self.iter_ledger(dataset_id, kind=kind, since=since, until=until,
                                         page_size=page_size))
        text = self.export_ledger(dataset_id, kind=kind, since=since, until=until)
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def ledger_page(self, dataset_id: str, *, kind: str | Sequence[str] | None = None,
                    since: str | None = None, until: str | None = None,
                    limit: int | None = None, cursor: str | None = None,
                    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page (``limit`` events read, those of ``kind`` kept: maybe fewer) and the
        next page's cursor (None: the last page)."""
        resp = self.send("GET", f"/v1/datasets/{_seg(dataset_id)}/ledger",
                         params={**self._ledger_query(kind, since, until), "limit": limit,
                                 "cursor": cursor})
        docs: list[dict[str, Any]] = resp.json()
        return docs, resp.headers.get("X-Next-Cursor") or _link_cursor(resp)

    def iter_ledger(self, dataset_id: str, *, kind: str | Sequence[str] | None = None,
                    since: str | None = None, until: str | None = None,
                    page_size: int | None = None) -> Iterator[dict[str, Any]]:
        """Every audit event, oldest first, fetched a page at a time."""
        return self._pages(f"/v1/datasets/{_seg(dataset_id)}/ledger",
                           {**self._ledger_query(kind, since, until), "limit": page_size})

    def export_ledger(self, dataset_id: str, *, kind: str | Sequence[str] | None = None,
                      since: str | None = None, until: str | None = None) -> str:
        """The audit stream as JSONL text, exactly as the server wrote it (for archives)."""
        resp = self.send("GET", f"/v1/datasets/{_seg(dataset_id)}/ledger",
                         params={**self._ledger_query(kind, since, until), "format": "jsonl"},
                         accept="application/x-ndjson")
        return resp.text

    # -- keys ------------------------------------------------------------------------

    def create_key(self, role: str, *, label: str | None = None,
                   datasets: Sequence[str] | None = None,
                   expires_at: str | None = None) -> dict[str, Any]:
        """A new key; the answer's ``token`` is the only time the secret is shown."""
        body: dict[str, Any] = {"role": role}
        if label is not None:
            body["label"] = label
        if datasets is not None:
            body["datasets"] = list(datasets)
        if expires_at is not None:
            body["expires_at"] = expires_at
        doc: dict[str, Any] = self.request("POST", "/v1/keys", json_body=body)
        return doc

    def list_keys(self) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = self._get("/v1/keys")
        return docs

    def revoke_key(self, key_id: str) -> None:
        self.request("DELETE", f"/v1/keys/{_seg(key_id)}")

    # -- releases --------------------------------------------------------------------

    @staticmethod
    def _release_body(dataset_id: str, mechanism: str, params: Mapping[str, Any] | None,
                      budget: Mapping[str, float], version: int | None = None
                      ) -> dict[str, Any]:
        body: dict[str, Any] = {"dataset_id": dataset_id, "mechanism": mechanism,
                                "params": dict(params or {}), "budget": dict(budget)}
        if version is not None:
            body["version"] = int(version)
        return body

    def create_release(self, dataset_id: str, mechanism: str, params: Mapping[str, Any] | None,
                       budget: Mapping[str, float], *,
                       idempotency_key: str | None = None,
                       version: int | None = None) -> dict[str, Any]:
        """Reserve and enqueue; an identical earlier request comes back ``replayed``.

        The release is ``queued``, or ``pricing`` when a worker must first compute its
        cost (it then reserves and runs it, or ends it ``refused`` with ``error`` the
        problem this call would have raised); ``wait`` follows either.

        Pass your own ``idempotency_key`` to make a retry across process restarts safe.
        ``version``: the dataset version to release from (default: its current one).
        """
        doc: dict[str, Any] = self.request(
            "POST", "/v1/releases", json_body=self._release_body(
                dataset_id, mechanism, params, budget, version),
            idempotency_key=idempotency_key)
        return doc

    def submit(self, dataset_id: str, mechanism: str, params: Mapping[str, Any] | None,
               budget: Mapping[str, float], *,
               idempotency_key: str | None = None, version: int | None = None) -> Release:
        """``create_release`` as a :class:`Release` object (``.wait()``, ``.to_pandas()``)."""
        return Release(self, self.create_release(dataset_id, mechanism, params, budget,
                                                 idempotency_key=idempotency_key,
                                                 version=version))

    def estimate_release(self, dataset_id: str, mechanism: str,
                         params: Mapping[str, Any] | None,
                         budget: Mapping[str, float] | None = None, *,
                         target: float | Mapping[str, Any] | None = None,
                         timeout: float = 120.0, version: int | None = None) -> dict[str, Any]:
        """Cost, expected accuracy and remaining budget; spends nothing.

        Give a ``budget``, or a ``target`` accuracy instead: a half-width (every released
        number's stated 95 % interval within ± it), or ``{"half_width", "level", "delta"}``
        (``delta``: held fixed for an (epsilon, delta) mechanism). The answer is then the
        estimate of the smallest budget meeting it, with ``budget`` (what
        ``create_release`` takes) and ``target``.

        A cost that needs a heavy precomputation nobody has computed yet is answered 202
        ``pricing`` while a worker computes it: asked again after its ``retry_after``
        seconds until answered, for at most ``timeout`` seconds (then TimeoutError).
        """
        if (budget is None) == (target is None):
            raise ValueError("give a budget or a target, not both")
        body = self._release_body(dataset_id, mechanism, params, budget or {}, version)
        if target is not None:
            del body["budget"]
            body["target"] = (dict(target) if isinstance(target, Mapping)
                              else {"half_width": float(target)})
        deadline = time.monotonic() + timeout
        while True:
            doc: dict[str, Any] = self.request("POST", "/v1/releases/estimate",
                                               json_body=body)
            if doc.get("status") != "pricing":
                return doc
            pause = float(doc.get("retry_after") or 1)
            if time.monotonic() + pause > deadline:
                raise TimeoutError(f"estimate still pricing after {timeout:g} s")
            time.sleep(pause)

    estimate = estimate_release

    def budget_for(self, dataset_id: str, mechanism: str, params: Mapping[str, Any] | None,
                   half_width: float, *, delta: float | None = None,
                   timeout: float = 120.0, version: int | None = None) -> dict[str, Any]:
        """The smallest budget whose stated 95 % interval is within ±``half_width``, as
        ``create_release`` takes it (``estimate_release`` with a target, its ``budget``)."""
        wanted: dict[str, Any] = {"half_width": float(half_width), "level": 0.95}
        if delta is not None:
            wanted["delta"] = delta
        doc = self.estimate_release(dataset_id, mechanism, params, target=wanted,
                                    timeout=timeout, version=version)
        found: dict[str, Any] = doc["budget"]
        return found

    def list_releases(self, *, dataset_id: str | None = None, limit: int | None = None,
                      cursor: str | None = None) -> list[dict[str, Any]]:
        """One page, newest first; ``iter_releases`` follows the cursor to the end."""
        docs: list[dict[str, Any]] = self._get(
            "/v1/releases", dataset_id=dataset_id, limit=limit, cursor=cursor)
        return docs

    def iter_releases(self, *, dataset_id: str | None = None,
                      page_size: int | None = None) -> Iterator[dict[str, Any]]:
        """Every release this key may see, newest first, fetched a page at a time."""
        return self._pages("/v1/releases", {"dataset_id": dataset_id, "limit": page_size})

    def get_release(self, release_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self._get(f"/v1/releases/{_seg(release_id)}")
        return doc

    def release(self, release_id: str) -> Release:
        """An existing release as a :class:`Release` object."""
        return Release(self, self.get_release(release_id))

    def wait(self, release_id: str, timeout: float, poll: float = 0.2,
             on_poll: Callable[[dict[str, Any], float], None] | None = None
             ) -> dict[str, Any]:
        """Poll until the release is succeeded, failed, cancelled or refused; its last
        document.

        ``on_poll(doc, elapsed_seconds)`` sees every poll (progress display). Raises
        ``TimeoutError`` after ``timeout`` seconds; the release goes on regardless.
        """
        start = time.monotonic()
        while True:
            doc = self.get_release(release_id)
            elapsed = time.monotonic() - start
            if on_poll is not None:
                on_poll(doc, elapsed)
            if doc.get("status") in TERMINAL:
                return doc
            if elapsed + poll > timeout:
                raise TimeoutError(
                    f"release {release_id} still {doc.get('status')} after {timeout:g} s")
            time.sleep(poll)

    def release_data(self, release_id: str) -> str:
        """The release's privatized microdata as CSV text (one row per record)."""
        resp = self.send("GET", f"/v1/releases/{_seg(release_id)}/data", accept="text/csv")
        return resp.text

    def release_plot(self, release_id: str) -> bytes:
        """The server's PNG drawing of a released function."""
        resp = self.send("GET", f"/v1/releases/{_seg(release_id)}/plot.png",
                         accept="image/png")
        return resp.content

    # -- analyses --------------------------------------------------------------------

    def analyze(self, release_id: str, analysis: str, params: Mapping[str, Any] | None = None,
                releases: Sequence[str] = ()) -> dict[str, Any]:
        """Queue free post-processing of a release (spends no budget)."""
        body = {"analysis": analysis, "params": dict(params or {}), "releases": list(releases)}
        doc: dict[str, Any] = self.request(
            "POST", f"/v1/releases/{_seg(release_id)}/analyses", json_body=body)
        return doc

    def list_analyses(self, release_id: str, *, limit: int | None = None,
                      cursor: str | None = None) -> list[dict[str, Any]]:
        """One page, newest first; ``iter_analyses`` follows the cursor to the end."""
        docs: list[dict[str, Any]] = self._get(
            f"/v1/releases/{_seg(release_id)}/analyses", limit=limit, cursor=cursor)
        return docs

    def iter_analyses(self, release_id: str, *,
                      page_size: int | None = None) -> Iterator[dict[str, Any]]:
        """Every analysis of a release, newest first, fetched a page at a time."""
        return self._pages(f"/v1/releases/{_seg(release_id)}/analyses", {"limit": page_size})

    def get_analysis(self, release_id: str, analysis_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self._get(
            f"/v1/releases/{_seg(release_id)}/analyses/{_seg(analysis_id)}")
        return doc

    def analysis(self, release_id: str, analysis_id: str) -> Analysis:
        """An existing analysis as an :class:`Analysis` object."""
        return Analysis(self, self.get_analysis(release_id, analysis_id))

    def cancel_analysis(self, release_id: str, analysis_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.request(
            "POST", f"/v1/releases/{_seg(release_id)}/analyses/{_seg(analysis_id)}/cancel")
        return doc

    def wait_analysis(self, release_id: str, analysis_id: str, timeout: float,
                      poll: float = 0.2) -> dict[str, Any]:
        """Poll until the analysis ended; TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            doc = self.get_analysis(release_id, analysis_id)
            if doc.get("status") in _ANALYSIS_TERMINAL:
                return doc
            if time.monotonic() + poll > deadline:
                raise TimeoutError(f"analysis {analysis_id} still {doc.get('status')}")
            time.sleep(poll)

    # -- jobs and catalog ------------------------------------------------------------

    def list_jobs(self, *, status: str | None = None, limit: int | None = None,
                  cursor: str | None = None) -> list[dict[str, Any]]:
        """One page of the queue (operators); ``iter_jobs`` follows the cursor."""
        docs: list[dict[str, Any]] = self._get("/v1/jobs", status=status, limit=limit,
                                               cursor=cursor)
        return docs

    def iter_jobs(self, *, status: str | None = None,
                  page_size: int | None = None) -> Iterator[dict[str, Any]]:
        return self._pages("/v1/jobs", {"status": status, "limit": page_size})

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued job (its reservation is refunded); 409 ``job_running``."""
        doc: dict[str, Any] = self.request("POST", f"/v1/jobs/{_seg(job_id)}/cancel")
        return doc

    def mechanisms(self) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = self._get("/v1/mechanisms")
        return docs

    def index(self) -> dict[str, Any]:
        """The server's front door (``GET /``): its name, version and entry points."""
        doc: dict[str, Any] = self._get("/")
        return doc

    def health(self) -> dict[str, Any]:
        doc: dict[str, Any] = self._get("/healthz")
        return doc

    def ready(self) -> dict[str, Any]:
        doc: dict[str, Any] = self._get("/readyz")
        return doc

    # -- drawings and the API's description (every route has a method: see
    # tests/unit/test_route_coverage.py) ---------------------------------------------

    def release_plot_svg(self, release_id: str) -> bytes:
        """The server's SVG drawing of a release (the same figure as ``release_plot``)."""
        resp = self.send("GET", f"/v1/releases/{_seg(release_id)}/plot.svg",
                         accept="image/svg+xml")
        return resp.content

    def analysis_plot(self, release_id: str, analysis_id: str) -> bytes:
        """The server's PNG drawing of an analysis's result (NPMLE CDF, fitted CDF,
        functionals with intervals, subset estimates); 404 when it has nothing to draw."""
        resp = self.send(
            "GET", f"/v1/releases/{_seg(release_id)}/analyses/{_seg(analysis_id)}/plot.png",
            accept="image/png")
        return resp.content

    def analysis_plot_svg(self, release_id: str, analysis_id: str) -> bytes:
        """The server's SVG drawing of an analysis (the same figure as the PNG)."""
        resp = self.send(
            "GET", f"/v1/releases/{_seg(release_id)}/analyses/{_seg(analysis_id)}/plot.svg",
            accept="image/svg+xml")
        return resp.content

    def openapi(self) -> dict[str, Any]:
        """The server's OpenAPI document (``/openapi.json``), e.g. to generate a client."""
        doc: dict[str, Any] = self._get("/openapi.json")
        return doc


def _file_part(file: FileArg, filename: str | None) -> tuple[str, bytes, str]:
    """An upload's ``file`` part: (name, bytes, media type). A DataFrame is framed as
    Parquet (``frames.frame_upload``); the bytes are kept so every retry resends them."""
    framed = frames.frame_upload(file)
    if framed is not None:
        content, name, _ = framed
        name = filename or name
    elif isinstance(file, bytes):
        content, name = file, filename or "data.csv"
    elif isinstance(file, str | os.PathLike):
        path = Path(file)
        content, name = path.read_bytes(), filename or path.name
    else:
        content = file.read()
        name = filename or Path(getattr(file, "name", "data.csv")).name
    kind = frames.PARQUET_TYPE if _is_parquet(content) else "text/csv"
    return name, content, kind


def _link_cursor(resp: requests.Response) -> str | None:
    """The ``cursor`` of a ``Link: <...>; rel="next"`` header (requests parses it)."""
    from urllib.parse import parse_qs, urlsplit

    nxt = resp.links.get("next")
    if not nxt:
        return None
    values = parse_qs(urlsplit(nxt.get("url", "")).query).get("cursor")
    return values[0] if values else None
