"""The ledger's vocabulary: what a release's steps send and answer, whatever keeps them.

All amounts are integer units (see ``service.budget``). ``service.storage.store.Store``
is the ledger's interface and ``service.storage.pg_ledger.PgLedger`` keeps it on
PostgreSQL (issue #29), each step one transaction, so any number of API processes and
workers on any number of hosts can never hold or spend more than a cap (DESIGN §3), nor
more than an analyst key's allocation inside it. A worker runs a job under a lease named
by a token of that run (``Run``), and settles it only while the lease is still that
token's, in the same step that settles: a run that stalled past its lease while another
run took the job over can neither store a second output nor refund the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

Outcome = Literal["reserved", "pricing", "replay", "idempotent", "idem_mismatch", "exhausted",
                  "retired", "version_retired", "ended", "notion_locked", "not_admitted",
                  "stale"]
#: how ``Store.reserve`` treats the release: a new release with its cost, a release
#: created to be priced by a job (nothing held), or that release being reserved
Mode = Literal["new", "pricing", "priced"]
Settled = Literal["settled", "ended", "running", "lost"]
#: settle's lease condition for the sweeper: only if no run holds the job's lease
NO_LEASE = "!"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class ReserveResult:
    """What ``reserve`` decided; ``release_id`` is the new or the earlier release.

    When exhausted, ``scope`` says whose cap was short: the dataset's or the
    actor's allocation; when ``ended`` (a priced release that left ``pricing``),
    ``status`` is the status it has; when ``notion_locked``, ``notion`` is the
    notion the dataset is locked to.
    """

    outcome: Outcome
    release_id: str = ""
    measure: str = ""
    requested: int = 0
    remaining: int = 0
    scope: str = ""
    status: str = ""
    notion: str = ""
    listed: bool = True


@dataclass(frozen=True)
class Reservation:
    """One release's call to ``Store.reserve``: which release, its cost in units, who
    asks, and how a retry or a replay of it is recognised."""

    dataset_id: str
    release_id: str
    #: integer ledger units per measure (``service.budget``); empty for a ``pricing`` one
    cost: dict[str, int]
    actor: str
    #: what the ``idempotency_key`` must match (the request); names the replay key unless
    #: ``replay_fingerprint`` does (the request with its cost)
    fingerprint: str
    #: the stored request (``service.releases.request.JobRequest.to_json``)
    request_json: str
    #: whether an identical earlier release answers this one (a ``pricing`` one: no)
    replay: bool = True
    idempotency_key: str | None = None
    idempotency_ttl: int = 86400
    at: str | None = None
    mode: Mode = "new"
    replay_fingerprint: str | None = None
    #: 'dp' or 'noiseless' (``budget.notion_lock``): the notion this release locks to
    notion_lock: str = ""
    #: the stamp of the registry read it was priced on (``Store.dataset_for_pricing``):
    #: the store reserves nothing and answers ``stale`` if the dataset's differs now
    #: ('': not checked)
    stamp: str = ""


@dataclass(frozen=True)
class Run:
    """One attempt at a job: its lease token and its attempt number (1, 2, ...).

    The token is the lease's value while this run holds it; the attempt number
    names the run's output files, so two runs never write to the same place.
    ``mark_running`` also hands the run what it reads next, read with the start:
    the release's ``request`` and its dataset's ``dataset_document`` (None: no such
    dataset); a ``Run`` made otherwise has neither (``""``, None).
    """

    release_id: str
    token: str
    attempt: int
    request: str = field(default="", compare=False, repr=False)
    dataset_document: str | None = field(default=None, compare=False, repr=False)


#: the sweeper's two kinds of message: a release's run (the ``releases`` queue) and its
#: pricing job (the ``pricing`` queue)
RUN, PRICING = "run", "pricing"


@dataclass(frozen=True)
class SendMarks:
    """What ``Store.sweep_marks`` learnt, for ``Store.passed``: the age from which a
    pending release is judged (``older_than``, s) and, per kind of message (``RUN``,
    ``PRICING``), the witness bound: the mark taken before the first message of the
    newest release whose message of that kind a worker took ``witness_age`` s ago or
    more (absent: none known)."""

    older_than: float
    bounds: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Passed:
    """A pending release ``Store.passed`` found: its ``status`` when marked ('' if the
    store did not read it), creation (epoch s) and mark; ``gone`` if its last message is
    known to be off its queue (the sweeper then looks whether a worker holds it), else
    taken past once (``Store.confirm_passed`` marks it again)."""

    release_id: str
    status: str
    created: float
    seq: int
    gone: bool


class CapError(ValueError):
    """A cap change the ledger refused; ``reason`` is below_spent or above_dataset,
    ``key_id`` the allocation refused (None: the dataset's cap)."""

    def __init__(self, reason: str, measure: str, units: int,
                 key_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.measure, self.units, self.key_id = reason, measure, units, key_id


#: every kind of audit event the ledger writes (the ledger view's ``kind`` filter)
EVENT_KINDS = ("cap", "allocation", "reserve", "commit", "abort", "cancel", "refuse",
               "retire", "version", "policy")
#: an allocation's rule (``Store.allocation_scopes``): ``listed`` (written with every
#: allocation: the measures it lists, none of the others) or ``legacy`` (an allocation
#: from before that rule, marked by ``service.policy.migrate``: unlisted measures
#: unlimited, as they were); none: no allocation
ALLOCATION_SCOPES = ("listed", "legacy")
#: most audit events one read of the store returns: a long read (an export) holds one
#: batch at a time
READ_BATCH = 1000
