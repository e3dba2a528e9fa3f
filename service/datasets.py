"""Dataset registry: metadata in the system of record (``service.storage.store``),
columns as objects of the object store (``service.storage.dataset_files``), caps in the
ledger.

Registration is all-or-nothing: files are written atomically first, then
metadata and caps go to the record in one step (``Store.open``, at most once);
if that fails the files are removed, so a refused or failed upload leaves
nothing behind (files whose registration may have been stored stay until
the orphan sweep knows it was not). Columns
arrive in chunks and go straight to disk, so an upload never holds a whole
dataset in memory: they are staged in a local file and stored in one conditional step.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from mechanisms import ColumnMeta, DatasetMeta, rows
from service import budget
from service.ingest import DatasetSpec
from service.metadata import ACCOUNTING_FIELDS
from service.sources import Scan
from service.storage import index
from service.storage.dataset_files import DatasetStore
from service.storage.ledger import now_iso
from service.storage.store import Store

#: the version's private file holding its row-order key (``mechanisms.rows``)
ROW_KEY = "row_key"


def row_key(store: DatasetStore, dataset_id: str, version: int) -> rows.RowKey:
    """The dataset's secret row-order key and its order version, as the version's file
    records them (v1 for a version stored before v2: its order never changes). A version
    stored before keys gets one now, of the current version: it has released no order."""
    return rows.RowKey.from_file(store.private_file(
        dataset_id, version, ROW_KEY, lambda: rows.new_row_key().to_file()))


def column_doc(col: ColumnMeta, fill: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": col.type}
    if col.bounds is not None:
        doc["bounds"] = list(col.bounds)
    if col.categories is not None:
        doc["categories"] = list(col.categories)
    if col.subset_policy is not None:
        doc["subset_policy"] = dict(col.subset_policy)
    if col.prior is not None:
        doc["prior"] = dict(col.prior)
    if col.grid is not None:
        doc["grid"] = list(col.grid)
        doc["norm_bound"] = col.norm_bound
    if fill is not None:
        doc["allow_missing"] = True
        doc["fill"] = fill
    return doc


def register(
    store: DatasetStore,
    ledger: Store,
    spec: DatasetSpec,
    caps: dict[str, int],
    chunks: Iterable[Mapping[str, np.ndarray]],
    actor: str,
    idempotency: Idempotency | None = None,
    sha256: str | None = None,
    source: Scan | None = None,
) -> dict[str, Any]:
    """Store a new dataset (version 1) and open its ledger; returns its document.

    ``chunks`` are consecutive row blocks of every column (``ingest.iter_upload``, or a
    ``source``'s scan: its summary goes in the document, its pins in the manifest);
    an error raised while iterating them leaves nothing behind. With an
    ``idempotency`` key that another upload registered first (concurrently),
    this upload's files go and that dataset's document is returned.
    """
    dataset_id = "ds_" + secrets.token_hex(8)
    with store.staging() as staged:
        for chunk in chunks:
            staged.append(chunk)
        # the secret row order of its microdata releases: private, beside the columns
        staged.write_private(ROW_KEY, rows.new_row_key().to_file())
        doc = {
            "id": dataset_id,
            "version": 1,
            "name": spec.name,
            "n_rows": staged.n_rows,
            "columns": {n: column_doc(c, spec.fill.get(n)) for n, c in spec.columns.items()},
            "bounds_policy": spec.bounds_policy,
            "public": spec.public,
            "allow_holdout": spec.allow_holdout,
            "keep_row_order": spec.keep_row_order,
            **({"subset_policy": spec.subset_policy} if spec.subset_policy else {}),
            "budgets": {m: budget.display(m, u) for m, u in sorted(caps.items())},
            **spec.accounting,
            # the policy stored resolved, so no reader defaults: the notions named, else
            # those of the measures the budgets name; record-level releases only if opted in
            "notions": list(spec.accounting.get("notions") or budget.default_notions(caps)),
            "record_level": bool(spec.accounting.get("record_level", False)),
            "status": "active",
            "created_at": now_iso(),
            "created_by": actor,
            **({"sha256": sha256} if sha256 else {}),
            **({"source": source.summary()} if source else {}),
        }
        doc["current_version"] = 1
        doc["versions"] = [version_entry(doc)]
        staged.commit(dataset_id, 1, {**doc, "source": source.record()} if source else doc)
    try:
        outcome, registered = ledger.open(
            dataset_id, caps, actor, json.dumps(doc),
            idempotency_key=idempotency.key if idempotency else None,
            fingerprint=idempotency.fingerprint if idempotency else "",
            idempotency_ttl=idempotency.ttl if idempotency else 0)
    except Exception:
        if not _maybe_stored(ledger, dataset_id):
            store.remove(dataset_id, 1)
        raise
    if registered == dataset_id:
        return doc
    store.remove(dataset_id, 1)
    if outcome == "idem_mismatch":
        raise IdempotencyMismatch
    first = get(ledger, registered)
    assert first is not None  # the key and the dataset are written together
    return first


@dataclass(frozen=True)
class Idempotency:
    """An upload's ``Idempotency-Key`` (as stored), what it was for, how long it holds."""

    key: str
    fingerprint: str
    ttl: int


class IdempotencyMismatch(Exception):
    """The Idempotency-Key registered a dataset from other metadata."""


def idempotent(ledger: Store, idempotency: Idempotency) -> dict[str, Any] | None:
    """The dataset an earlier upload with this key registered (None: none yet).

    Asked before the file is parsed, so a retried upload costs no second parse.
    """
    known = ledger.idempotency_record(idempotency.key)
    if known is None or known[1] is None:
        return None
    if known[0] != idempotency.fingerprint:
        raise IdempotencyMismatch
    return get(ledger, known[1])


def _maybe_stored(ledger: Store, dataset_id: str) -> bool:
    """Whether a registration whose step raised may be stored all the same.

    A reply lost after the step ran leaves the metadata stored: removing the files then
    would leave a dataset no file backs. The record is asked again; when it cannot
    answer, the files stay and ``DatasetStore.sweep_orphans`` removes them once the id
    is known to be unregistered.
    """
    try:
        return ledger.dataset_document(dataset_id) is not None
    except Exception:  # the record cannot answer now (Valkey or PostgreSQL away)
        return True


def get(ledger: Store, dataset_id: str) -> dict[str, Any] | None:
    raw = ledger.dataset_document(dataset_id)
    return json.loads(raw) if raw is not None else None


def page(ledger: Store, limit: int, after: index.Cursor | None,
         granted: frozenset[str] | None) -> tuple[list[dict[str, Any]], index.Cursor | None]:
    """One page of datasets, newest first, and the next page's cursor, of every dataset
    (``granted`` None) or of the ``granted`` ones. Each page costs O(log N + limit)
    whatever the number of datasets, never a read of all (``Store.datasets_page``)."""
    ids, nxt = ledger.datasets_page(limit, after, granted)
    raws = ledger.dataset_documents(ids)
    return [json.loads(raw) for raw in raws if raw is not None], nxt


def meta(doc: dict[str, Any]) -> DatasetMeta:
    """The public metadata mechanisms see, rebuilt from the stored document."""
    cols = {
        name: ColumnMeta(
            name=name,
            type=c["type"],
            bounds=tuple(c["bounds"]) if "bounds" in c else None,
            categories=tuple(c["categories"]) if "categories" in c else None,
            prior=c.get("prior"),
            grid=tuple(c["grid"]) if "grid" in c else None,
            norm_bound=c.get("norm_bound"),
            subset_policy=c.get("subset_policy"),
        )
        for name, c in doc["columns"].items()
    }
    return DatasetMeta(n_rows=int(doc["n_rows"]), columns=cols,
                       allow_holdout=bool(doc.get("allow_holdout", False)),
                       gaussian_accounting=str(doc.get("gaussian_accounting", "approx_dp")),
                       subset_policy=doc.get("subset_policy"),
                       keep_row_order=bool(doc.get("keep_row_order", False)))


def set_status(ledger: Store, dataset_id: str, status: str) -> dict[str, Any]:
    """Update a dataset's status in its stored document; returns the document."""
    text = ledger.set_dataset_status(dataset_id, status)
    if text is None:
        raise LookupError("no such dataset")
    return dict(json.loads(text))


def record_holdout(ledger: Store, dataset_id: str, payload: str) -> None:
    """Count hold-out exposure after a committed release that held rows out of DP.

    The release's result says so (``reference.kind == "holdout"`` with its
    ``holdout_rows``); those rows are not protected by DP, so the operator
    sees how many have served (spec §8.4: ``holdout_exposures``).
    """
    reference = json.loads(payload).get("result", {}).get("reference")
    if not isinstance(reference, dict) or reference.get("kind") != "holdout":
        return
    ledger.record_holdout(dataset_id, int(reference["holdout_rows"]))


def holdout_exposure(ledger: Store, dataset_id: str) -> dict[str, int]:
    """Rows that have served as a hold-out reference, and the releases that used one."""
    return ledger.holdout_exposure(dataset_id)


# --------------------------------------------------------------------------- versions
#
# A dataset is one group of people with one budget; a version is one table of them
# (a refreshed extract, a corrected file). The dataset document keeps the current
# version's ``version``, ``n_rows`` and ``columns`` at the top (what a release without
# ``version`` uses) and every version in ``versions``; the ledger stays the dataset's.

#: dataset-level metadata a version can not change (the dataset's budget, notions and
#: policies): a version's metadata naming another value is refused, naming the field
DATASET_FIELDS = ("name", "budgets", "bounds_policy", "public", "allow_holdout",
                  "keep_row_order", "subset_policy", "gaussian_accounting", "zcdp_delta",
                  "notions", "allow_mixed_noiseless_dp", "record_level")
#: column metadata a version may change (what the values are bounded by); the rest
#: (type, grid: the column's kind and shape; subset_policy: a policy) is the dataset's
VERSION_COLUMN_FIELDS = frozenset({"bounds", "categories", "allow_missing", "fill",
                                   "prior", "norm_bound"})


#: the answer to a release on a retired version (``at_version``, and the ledger's refusal)
VERSION_RETIRED = ("this version of the dataset is retired: it takes no new releases (its"
                   " releases stay readable)")


class VersionError(Exception):
    """A version request refused: ``status`` (404, 409, 422), ``code``, ``field``."""

    def __init__(self, status: int, message: str, code: str, field: str = "version") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.field = status, message, code, field


def version_entry(doc: dict[str, Any]) -> dict[str, Any]:
    """The top-level (current) version of a document as a ``versions`` entry."""
    entry = {"version": int(doc["version"]), "n_rows": int(doc["n_rows"]),
             "created_at": doc.get("created_at"), "created_by": doc.get("created_by"),
             "status": "active", "columns": doc["columns"]}
    if doc.get("sha256"):
        entry["sha256"] = doc["sha256"]
    if doc.get("source"):
        entry["source"] = doc["source"]
    return entry


def versions_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every version of the dataset, oldest first (a document from before versions has
    its one version at the top)."""
    return list(doc.get("versions") or [version_entry(doc)])


def current_version(doc: dict[str, Any]) -> int:
    return int(doc.get("current_version", doc["version"]))


def find_version(doc: dict[str, Any], version: int) -> dict[str, Any]:
    """One version's entry; VersionError 404 if the dataset has no such version."""
    for entry in versions_of(doc):
        if entry["version"] == version:
            return entry
    raise VersionError(404, "no such version of this dataset", "not_found")


def at_version(doc: dict[str, Any], version: int | None = None) -> dict[str, Any]:
    """The document as a release on ``version`` (None: the current one) sees it: that
    version's number, rows and columns; the dataset's budget, notions and policies.
    A retired version is refused (409 version_retired): it takes no new release."""
    entry = find_version(doc, current_version(doc) if version is None else version)
    if entry["status"] != "active":
        raise VersionError(409, VERSION_RETIRED, "version_retired")
    return {**doc, "version": entry["version"], "n_rows": entry["n_rows"],
            "columns": entry["columns"]}


def spec_of(doc: dict[str, Any], version: int | None = None) -> DatasetSpec:
    """The upload metadata of a version (default: current), for a new version of the
    same schema: its columns and fills, the dataset's policies."""
    view = at_version(doc, version) if version is not None else doc
    return DatasetSpec(
        name=doc["name"], columns=dict(meta(view).columns),
        fill={n: c["fill"] for n, c in view["columns"].items() if c.get("allow_missing")},
        bounds_policy=doc["bounds_policy"], budgets=dict(doc.get("budgets", {})),
        public=bool(doc.get("public", False)), allow_holdout=bool(doc.get("allow_holdout")),
        accounting={f: doc[f] for f in ACCOUNTING_FIELDS if f in doc},
        subset_policy=doc.get("subset_policy"), keep_row_order=bool(doc.get("keep_row_order")))


def check_compatible(doc: dict[str, Any], spec: DatasetSpec, caps: dict[str, int]) -> None:
    """Refuse (422 naming the field) new-version metadata that is not the dataset's schema:
    other column names or kinds, or other dataset-level fields (budgets, notions,
    policies are the dataset's: the same people, one budget). Bounds, categories,
    fills and priors may change."""
    def refuse(field: str, message: str) -> NoReturn:
        raise VersionError(422, message, "incompatible_version", f"metadata.{field}")

    old = spec_of(doc)
    if list(spec.columns) != list(old.columns):
        missing = sorted(set(old.columns) ^ set(spec.columns))
        where = f"columns.{missing[0]}" if missing else "columns"
        refuse(where, "a version has the dataset's columns, by name and in order")
    new_caps = {m: budget.display(m, u) for m, u in sorted(caps.items())}
    if new_caps != doc.get("budgets", new_caps):
        refuse("budgets", "budgets belong to the dataset, not to a version (the same people"
               " spend one budget); change caps with PATCH /v1/datasets/{id}/budget")
    ours, theirs = _dataset_fields(old), _dataset_fields(spec)
    for name in DATASET_FIELDS:
        # a document from before a field existed is compared on the fields it has
        if name in ours and _plain(ours[name]) != _plain(theirs.get(name)):
            refuse(name, f"{name} is the dataset's and can not change in a version")
    old_docs = {n: column_doc(c, old.fill.get(n)) for n, c in old.columns.items()}
    for name, col in spec.columns.items():
        ours, theirs = old_docs[name], column_doc(col, spec.fill.get(name))
        for field in sorted(set(ours) | set(theirs)):
            if field not in VERSION_COLUMN_FIELDS and ours.get(field) != theirs.get(field):
                refuse(f"columns.{name}.{field}", f"a column's {field} is the dataset's and"
                       " can not change in a version")


def _dataset_fields(spec: DatasetSpec) -> dict[str, Any]:
    return {"name": spec.name, "bounds_policy": spec.bounds_policy, "public": spec.public,
            "allow_holdout": spec.allow_holdout, "keep_row_order": spec.keep_row_order,
            "subset_policy": spec.subset_policy, **spec.accounting}


def _plain(value: Any) -> Any:
    """JSON-comparable (tuples as lists, numbers as themselves)."""
    return json.loads(json.dumps(value, default=list))


def _version_doc(doc: dict[str, Any], entry: dict[str, Any], make_current: bool
                 ) -> dict[str, Any]:
    """The document with ``entry`` added (and made current if asked)."""
    new = {**doc, "versions": [*versions_of(doc), entry]}
    new.setdefault("current_version", current_version(doc))
    return _with_current(new, entry["version"]) if make_current else new


def _with_current(doc: dict[str, Any], version: int) -> dict[str, Any]:
    entry = find_version(doc, version)
    return {**doc, "current_version": version, "version": version,
            "n_rows": entry["n_rows"], "columns": entry["columns"]}


def idempotent_version(ledger: Store, idempotency: Idempotency) -> int | None:
    """The version an earlier upload with this key stored (None: none yet)."""
    known = ledger.idempotency_record(idempotency.key)
    if known is None or known[2] is None:
        return None
    if known[0] != idempotency.fingerprint:
        raise IdempotencyMismatch
    return int(known[2])


def add_version(store: DatasetStore, ledger: Store, dataset_id: str,
                spec: DatasetSpec, chunks: Iterable[Mapping[str, np.ndarray]], actor: str, *,
                make_current: bool = False, sha256: str | None = None,
                idempotency: Idempotency | None = None, source: Scan | None = None
                ) -> dict[str, Any]:
    """Store the next version of a dataset; returns its ``versions`` entry (``source``:
    as ``register``).

    The files are staged and moved into place under the next free number (a
    concurrent upload that took it makes this one take the one after), then the
    document gains the version in one compare-and-set that also records the
    ``version`` event. Anything refused or failed on the way removes the files, so
    the record and the disk are as before. The ledger is not touched: the version
    spends the dataset's budget.
    """
    with store.staging() as staged:
        for chunk in chunks:
            staged.append(chunk)
        staged.write_private(ROW_KEY, rows.new_row_key().to_file())
        doc = get(ledger, dataset_id)
        if doc is None or doc.get("status") != "active":
            raise VersionError(409, "the dataset is retired: it takes no new version",
                               "dataset_retired", "dataset_id")
        version = max(e["version"] for e in versions_of(doc)) + 1
        entry: dict[str, Any] = {
            "version": version, "n_rows": staged.n_rows, "created_at": now_iso(),
            "created_by": actor, "status": "active",
            "columns": {n: column_doc(c, spec.fill.get(n)) for n, c in spec.columns.items()},
            **({"sha256": sha256} if sha256 else {}),
            **({"source": source.summary()} if source else {})}
        for _ in range(64):
            try:
                staged.commit(dataset_id, version, {
                    "id": dataset_id, **entry,
                    **({"source": source.record()} if source else {})})
                break
            except FileExistsError:  # another upload (or a kept orphan) has this number
                version += 1
                entry["version"] = version
        else:
            raise VersionError(409, "too many concurrent version uploads; retry",
                               "version_conflict")
    try:
        while True:
            raw = ledger.dataset_document(dataset_id)
            doc = json.loads(raw) if raw is not None else None
            if raw is None or doc is None or doc.get("status") != "active":
                raise VersionError(409, "the dataset is retired: it takes no new version",
                                   "dataset_retired", "dataset_id")
            new = _version_doc(doc, entry, make_current)
            outcome, done = ledger.version_change(
                dataset_id, raw, json.dumps(new),
                "uploaded,current" if make_current else "uploaded", version, actor,
                idempotency_key=idempotency.key if idempotency else None,
                fingerprint=idempotency.fingerprint if idempotency else "",
                idempotency_ttl=idempotency.ttl if idempotency else 0)
            if outcome == "ok" or (outcome == "idempotent" and done == version):
                return entry
            if outcome == "conflict":
                continue
            store.remove(dataset_id, version)  # the key's first upload stored another
            if outcome == "idem_mismatch":
                raise IdempotencyMismatch
            return find_version(doc, done)
    except (VersionError, IdempotencyMismatch):
        store.remove(dataset_id, version)
        raise
    except Exception:
        if not _version_maybe_stored(ledger, dataset_id, version):
            store.remove(dataset_id, version)
        raise


def _version_maybe_stored(ledger: Store, dataset_id: str, version: int) -> bool:
    """Whether a version whose document update raised may be stored all the same (as
    ``_maybe_stored``: when the record cannot say, the files stay)."""
    try:
        doc = get(ledger, dataset_id)
    except Exception:  # the record cannot answer now (Valkey or PostgreSQL away)
        return True
    return doc is not None and any(e["version"] == version for e in versions_of(doc))


def change_version(ledger: Store, dataset_id: str, version: int,
                   actor: str, *, current: bool = False, retire: bool = False
                   ) -> dict[str, Any]:
    """Make a version current, or retire it (one of the two); returns the new document.

    The current version can not be retired and a retired one can not be made current
    (409). Retiring keeps the files: the version's releases stay readable, its rows
    were already spent from the dataset's budget, and a release accepted just before
    the retirement still runs on them. Asking for what already holds changes nothing.
    The retirement is enforced by the ledger too (``version_change`` records the retired
    version in the same step; ``reserve`` refuses on it), so a release prepared
    before it is never reserved after it. A version retired before that field existed
    is refused by ``at_version`` alone (a retirement is never undone, so every request
    prepared since reads it).
    """
    if current == retire:
        raise ValueError("either current or retire")
    while True:
        raw = ledger.dataset_document(dataset_id)
        if raw is None:
            raise VersionError(404, "no such dataset", "not_found", "dataset_id")
        doc = json.loads(raw)
        entry = find_version(doc, version)
        if retire:
            if entry["status"] == "retired":
                return doc
            if current_version(doc) == version:
                raise VersionError(409, "the current version can not be retired: make"
                                   " another version current first", "version_current")
            new = {**doc, "current_version": current_version(doc), "versions": [
                {**e, "status": "retired"} if e["version"] == version else e
                for e in versions_of(doc)]}
        else:
            if current_version(doc) == version:
                return doc
            if entry["status"] != "active":
                raise VersionError(409, "a retired version can not be made current",
                                   "version_retired")
            new = _with_current({**doc, "versions": versions_of(doc)}, version)
        outcome, _ = ledger.version_change(dataset_id, raw, json.dumps(new),
                                           "retired" if retire else "current", version, actor)
        if outcome == "ok":
            return new


def reupload_warnings(ledger: Store, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Warnings for a new dataset that may hold the same people as an existing one.

    Privacy loss adds up per person: the same table registered again as a new dataset
    gets a second, fresh budget for the same people (a new version spends the first).
    An active private dataset with an active version of the same column set and row
    count is named (``same_file`` when the files' SHA-256 agree). A warning, not a
    refusal: tables of equal shape about different people are common (a panel's
    waves, one form in two regions), and only the operator knows which it is.

    The record is asked for the datasets of this shape only (``Store.same_shape_documents``:
    on PostgreSQL an index of the active versions' shapes), never for every dataset;
    each one it gives is checked here.
    """
    if doc.get("public"):
        return []
    columns, n_rows = set(doc["columns"]), int(doc["n_rows"])
    out: list[dict[str, Any]] = []
    for raw in ledger.same_shape_documents(sorted(columns), n_rows, doc["id"]):
        other = json.loads(raw)
        if other.get("status") != "active" or other.get("public"):
            continue
        for entry in versions_of(other):
            if (entry["status"] == "active" and set(entry["columns"]) == columns
                    and int(entry["n_rows"]) == n_rows):
                same_file = bool(doc.get("sha256")) and entry.get("sha256") == doc["sha256"]
                out.append({"code": "possible_reupload", "dataset_id": other["id"],
                            "version": entry["version"], "same_file": same_file,
                            "message": "an existing dataset has the same columns and row"
                            " count: if these are the same people, upload a version of it"
                            " instead (a new dataset is a second budget for them)"})
                break
    return out
