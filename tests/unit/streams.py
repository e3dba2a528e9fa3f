"""Batches and merges for the streaming tests: split columns into batches, update them in
any order, merge the partials in any tree shape, every pass of a statistic."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mechanisms.statistics import Partial, Statistic


def batches(data: Mapping[str, np.ndarray], cuts: Sequence[int]) -> list[dict[str, Any]]:
    edges = [0, *sorted(cuts), len(next(iter(data.values())))]
    return [{k: v[a:b] for k, v in data.items()} for a, b in itertools.pairwise(edges)]


def tree(statistic: Statistic, partials: list[Partial], picks: Sequence[int]) -> Partial:
    """Merge any two of the partials (chosen by ``picks``, in either order) until one is
    left: every tree shape and order of merges."""
    pool = list(partials)
    for pick in picks:
        if len(pool) == 1:
            break
        i = pick % len(pool)
        a = pool.pop(i)
        b = pool.pop((pick // 7) % len(pool))
        pool.append(statistic.merge(a, b) if pick % 2 else statistic.merge(b, a))
    while len(pool) > 1:
        pool.append(statistic.merge(pool.pop(), pool.pop(0)))
    return pool[0]


def streamed(statistic: Statistic, pieces: list[dict[str, Any]], order: Sequence[int],
              picks: Sequence[int]) -> tuple[Statistic, Partial]:
    """Every pass: batches updated in ``order``, two at a time into one partial where
    ``picks`` says so, then merged as ``tree`` says."""
    while True:
        partials: list[Partial] = []
        for k, index in enumerate(order):
            if partials and picks and picks[k % len(picks)] % 3 == 0:
                partials[-1] = statistic.update(partials[-1], pieces[index])
            else:
                partials.append(statistic.update(statistic.empty(), pieces[index]))
        partial = tree(statistic, partials or [statistic.empty()], picks)
        following = statistic.then(partial)
        if following is None:
            return statistic, partial
        statistic = following
