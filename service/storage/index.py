"""Opaque page cursors of the lists (releases, datasets, audit events).

A list's page ends at its last item, named by its score (a time) and member (an id), so a
page boundary stays put while items are added before it; the cursor is opaque to clients
(base64 of JSON) and checked when read back. The store pages by it
(``service.storage.pg_ledger``: one range scan of an index from the cursor).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass

from service.errors import Invalid


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the last item's score and member, and a list's phase (a list
    made of several indexes read one after the other, as the jobs list)."""

    score: float
    member: str
    phase: str = ""

    def encode(self) -> str:
        raw = json.dumps([self.score, self.member, self.phase], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str | None) -> Cursor | None:
        """The cursor a client sent back; 422 naming ``cursor`` if it is not one of ours."""
        if token is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            score, member, phase = json.loads(raw)
            if (not isinstance(score, int | float) or isinstance(score, bool)
                    or not math.isfinite(score) or not isinstance(member, str)
                    or not isinstance(phase, str)):
                raise ValueError
        except (ValueError, TypeError, binascii.Error):
            raise Invalid("not a cursor this server returned", code="validation_error",
                      field="cursor") from None
        return cls(float(score), member, phase)


#: the phase of a cursor over the audit events: its member is the store's event id
STREAM_PHASE = "stream"


def stream_cursor(event_id: str | None) -> Cursor | None:
    """The cursor of a page of audit events that ended at ``event_id`` (None: the last)."""
    if event_id is None:
        return None
    return Cursor(float(event_id.partition("-")[0]), event_id, STREAM_PHASE)


def stream_position(token: str | None) -> str | None:
    """The event id a cursor from ``stream_cursor`` names (the store checks its form:
    ``Store.audit_range``); 422 naming ``cursor`` for a list's cursor."""
    cursor = Cursor.decode(token)
    if cursor is None:
        return None
    if cursor.phase != STREAM_PHASE:
        raise Invalid("not a cursor this server returned", code="validation_error",
                      field="cursor")
    return cursor.member
