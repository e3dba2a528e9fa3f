"""A release's stored request: what the API accepted, what the worker runs, what the
document shows. ``JobRequest`` is the one reader and writer of its JSON.

The JSON is stored with the release (in Valkey while it is pending, then in the
document store) and read by the pricing job, the run, the composition of later
releases and the release document. Its fields are public inputs only: the design, the
cost and the accuracy statement computed from them, never anything the data decided.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from service import budget


@dataclass(frozen=True)
class JobRequest:
    """A release request as stored: the dataset version, the mechanism and its params
    (completed from the ledger's history), the cost the run calibrates to and the ledger
    units it holds, the accuracy statement, the seed and the callback."""

    dataset_id: str
    dataset_version: int
    mechanism: str
    params: dict[str, Any]
    #: the mechanism's own cost per measure (what its run calibrates to); empty while the
    #: release is ``pricing``
    cost: dict[str, Fraction] = field(default_factory=dict)
    #: what the ledger holds, in integer units per measure (``service.budget``)
    cost_units: dict[str, int] = field(default_factory=dict)
    accuracy: dict[str, Any] | None = None
    seed: int | None = None
    callback_url: str | None = None
    #: the release document's ``privacy`` block
    privacy: dict[str, Any] | None = None
    #: a ``pricing`` release's validated request body, which its pricing job prepares
    #: again in a worker (None once priced)
    body: dict[str, Any] | None = None

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "dataset_id": self.dataset_id,
            "dataset_version": self.dataset_version,
            "mechanism": self.mechanism,
            "params": self.params,
            "cost": {m: str(v) for m, v in self.cost.items()},
            "cost_units": self.cost_units,
            "accuracy": self.accuracy,
            "seed": self.seed,
            "callback_url": self.callback_url,
        }
        if self.body is not None:
            doc["body"] = self.body
        else:
            doc["privacy"] = self.privacy
        return json.dumps(doc, default=str)

    @classmethod
    def from_json(cls, raw: str) -> JobRequest:
        return cls.from_dict(json.loads(raw))

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> JobRequest:
        """From a stored request; one stored before costs were kept exactly has units only
        (``exact_cost`` derives the cost from them)."""
        return cls(
            dataset_id=doc["dataset_id"],
            dataset_version=doc["dataset_version"],
            mechanism=doc["mechanism"],
            params=doc["params"],
            cost={m: Fraction(v) for m, v in (doc.get("cost") or {}).items()},
            cost_units={m: int(u) for m, u in doc.get("cost_units", {}).items()},
            accuracy=doc.get("accuracy"),
            seed=doc.get("seed"),
            callback_url=doc.get("callback_url"),
            privacy=doc.get("privacy"),
            body=doc.get("body"),
        )

    def exact_cost(self) -> dict[str, Fraction]:
        """The cost, or for a request stored with units only, the units' amounts."""
        if self.cost:
            return dict(self.cost)
        return {m: budget.from_units(m, u) for m, u in self.cost_units.items()}


def request_fingerprint(dataset: dict[str, Any], mechanism: str, params: dict[str, Any],
                        requested: dict[str, Fraction], seed: int | None) -> str:
    """Same dataset version, mechanism, params as written, requested budget and seed: the
    same request. What an Idempotency-Key must match; known before the cost, so a key
    first used while its release was being priced matches the same request later."""
    body = {"dataset_id": dataset["id"], "version": dataset["version"],
            "mechanism": mechanism, "params": params,
            "budget": {m: str(v) for m, v in sorted(requested.items())}, "seed": seed}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(b"request\0" + canonical.encode()).hexdigest()
