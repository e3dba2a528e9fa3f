"""A test-only mechanism whose run fails in a way the data decides.

Installed by the test's fixture for the test's duration, and by a worker started
for the test (before its pool forks), never by the service: it stands for any
mechanism with a data-dependent failure, which the service must neither refund nor
describe. It is not installed on import, so other tests (e.g. "every registered
mechanism has an audit entry") never see it.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import RAISE, Schema, fields

import mechanisms
from mechanisms import DatasetMeta, Mechanism, Output, register, registry
from mechanisms.base import Budget, read_epsilon

NAME = "test.fails_on_data"
#: the raised messages carry this and a data value: neither may reach the client
SECRET = "secret-mean-is"


class _Params(Schema):
    class Meta:
        unknown = RAISE

    column = fields.String(required=True)


class FailsOnData(Mechanism):
    """Raises, with a message holding a data value, a different error for different data."""

    name = NAME
    measures = ("epsilon",)
    params_schema = _Params

    def cost(self, params: Mapping[str, Any], budget: Budget,
             meta: DatasetMeta) -> dict[str, Fraction]:
        meta.column(params["column"])
        return {"epsilon": read_epsilon(budget, NAME)}

    def accuracy(self, params: Mapping[str, Any], cost: Budget,
                 meta: DatasetMeta) -> dict[str, Any]:
        return {}

    def run(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        mean = float(np.mean(data[params["column"]]))
        if mean > 50:
            raise ValueError(f"{SECRET} {mean}")
        raise ZeroDivisionError(f"{SECRET} {mean}")


def install() -> None:
    """Register the mechanism in this process (once)."""
    if NAME not in mechanisms.names():
        register(FailsOnData())


def uninstall() -> None:
    """Take it out of this process's registry again."""
    registry._REGISTRY.pop(NAME, None)
