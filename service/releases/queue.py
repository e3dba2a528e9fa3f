"""Job names and queues: the one place that says which task runs where.

The API and the pricing job publish by name (``Queue``); the workers (``workers.tasks``)
register the same names; the broker's routes and time limits (``service.broker``) and
the sweeper's search for lost messages read the queues from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: releases and analyses wait in queues of their own, so analyses (free, and possibly
#: long) never hold the slots releases run in; ``privrelease worker --queues`` picks.
#: Pricing jobs (a cost's cold heavy precomputation, bounded by
#: PRIVRELEASE_MAX_PRECOMPUTE_WORK) have a queue of their own too, served by default
#: beside the releases, so pricing can be given hosts of its own
RELEASES_QUEUE = "releases"
ANALYSES_QUEUE = "analyses"
PRICING_QUEUE = "pricing"
QUEUES = (RELEASES_QUEUE, ANALYSES_QUEUE, PRICING_QUEUE)

#: run a reserved release (``service.releases.run``)
RUN_RELEASE = "privrelease.run_release"
#: price a release created ``pricing``, reserve it, and send its RUN_RELEASE
PRICE_RELEASE = "privrelease.price_release"
#: compute a cold estimate's heavy precomputation into the store
PRECOMPUTE_ESTIMATE = "privrelease.precompute_estimate"
#: free post-processing of released outputs (``service.analyses``)
RUN_ANALYSIS = "privrelease.run_analysis"
#: POST a finished release's document to its callback URL (``service.notify``)
NOTIFY = "privrelease.notify"

#: the queue of every task not in RELEASES_QUEUE (the broker's default)
ROUTES = {RUN_ANALYSIS: ANALYSES_QUEUE, PRICE_RELEASE: PRICING_QUEUE,
          PRECOMPUTE_ESTIMATE: PRICING_QUEUE}


def pricing_task_id(release_id: str) -> str:
    """The Celery task id of a release's pricing job (the run's is the release id)."""
    return f"{release_id}.pricing"


@dataclass(frozen=True)
class Queue:
    """The jobs the service publishes, each under its name, task id and queue.

    ``app`` is a Celery app bound to the broker (``service.broker.make_celery``); this
    class only publishes and revokes by name, so the service never imports the tasks.
    """

    app: Any

    def _send(self, name: str, args: list[Any], task_id: str | None = None) -> None:
        self.app.send_task(name, args=args, task_id=task_id,
                           queue=ROUTES.get(name, RELEASES_QUEUE))

    def run(self, release_id: str) -> None:
        """A reserved release's run; its task id is the release id."""
        self._send(RUN_RELEASE, [release_id], release_id)

    def price(self, release_id: str) -> None:
        """A ``pricing`` release's pricing job."""
        self._send(PRICE_RELEASE, [release_id], pricing_task_id(release_id))

    def estimate(self, body_json: str, marker: str) -> None:
        """A cold estimate's precomputation; the job drops ``marker`` when done."""
        self._send(PRECOMPUTE_ESTIMATE, [body_json, marker])

    def analysis(self, analysis_id: str) -> None:
        """An analysis run; its task id is the analysis id (so a cancel can revoke it)."""
        self._send(RUN_ANALYSIS, [analysis_id], analysis_id)

    def notify(self, release_id: str) -> None:
        """A finished release's callback."""
        self._send(NOTIFY, [release_id])

    def revoke(self, task_ids: str | list[str]) -> None:
        """Ask the workers to drop queued messages (best effort: a worker that misses it
        skips the job anyway, its status no longer being queued)."""
        self.app.control.revoke(task_ids)
