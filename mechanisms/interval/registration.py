"""Registers the ``interval.*`` mechanisms (with their analyses) at package import."""

from __future__ import annotations

from mechanisms.interval import categorical_entries
from mechanisms.interval.analyses import ANALYSES
from mechanisms.interval.entries import MECHANISMS
from mechanisms.registry import register

for _cls in MECHANISMS:
    _cls.analyses = ANALYSES
    register(_cls())

categorical_entries.ProgressiveCategoricalMechanism.analyses = categorical_entries.ANALYSES
register(categorical_entries.ProgressiveCategoricalMechanism())
