"""Registers the ``interval.*`` mechanisms (with their analyses) at package import."""

from __future__ import annotations

from mechanisms.interval import categorical_service
from mechanisms.interval.analyses import ANALYSES
from mechanisms.interval.service import MECHANISMS
from mechanisms.registry import register

for _cls in MECHANISMS:
    _cls.analyses = ANALYSES
    register(_cls())

categorical_service.ProgressiveCategoricalMechanism.analyses = categorical_service.ANALYSES
register(categorical_service.ProgressiveCategoricalMechanism())
