"""Progressive questions on a categorical value (the authors' survey code, spec §2.7).

The feasible set starts as all k categories. Each round draws a subset Q of
⌈|S|/2⌉ of the feasible options, uniformly and without looking at the value,
and asks "is your answer one of Q?": yes gives S ← Q (inclusion), no gives
S ← S \\ Q (exclusion). It stops after ``rounds`` rounds or when one option is
left (a rule on the released S only). Q depends only on released answers, so
the posterior of a record given its answers is the prior restricted to the
final S (Def 1, Remark 1), and its coverage is π(S).

Expected coverage is exact. For a category c other than the value, whether c
is still feasible after each round depends only on set sizes (Q is uniform
among subsets of its size), so P(c ∈ S_final | Y = y) = s_k, the same for every
c ≠ y and every y. Hence

    τ = Σ_y π_y (π_y + s_k (1 − π_y)) = s_k + (1 − s_k) Σ_y π_y²,

and the leakage (1 − s_k)(1 − Σπ²) is largest for the uniform prior: charging
(1 − s_k)(1 − 1/k) is an upper bound under every prior. s_k follows the size
chain: with m feasible and h = ⌈m/2⌉, Y ∈ Q w.p. h/m and c then stays w.p.
(h − 1)/(m − 1); Y ∉ Q w.p. (m − h)/m and c stays w.p. (m − h − 1)/(m − 1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.interval.npmle import NPMLEResult, npmle
from mechanisms.interval.ranges import Pieces

#: categories a progressive categorical release handles (masks are int64 bit sets)
MAX_CATEGORIES = 62

BoolArray = NDArray[np.bool_]


@functools.cache
def survival(m: int, rounds: int) -> Fraction:
    """P(a fixed other option is still feasible after ``rounds`` rounds | m feasible)."""
    if rounds == 0 or m <= 1:
        return Fraction(1) if rounds == 0 else Fraction(0)
    h = (m + 1) // 2
    stay_in = Fraction(h, m) * Fraction(h - 1, m - 1) * survival(h, rounds - 1)
    stay_out = (Fraction(m - h, m) * Fraction(m - h - 1, m - 1) * survival(m - h, rounds - 1)
                if m - h >= 1 else Fraction(0))
    return stay_in + stay_out


def expected_coverage(k: int, rounds: int, probs: ArrayLike | None = None) -> Fraction:
    """τ = s + (1 − s)Σπ² exactly (probs as given, uniform when None)."""
    s = survival(k, rounds)
    if probs is None:
        sq = Fraction(1, k)
    else:
        sq = sum((Fraction(float(p)) ** 2 for p in np.asarray(probs, dtype=np.float64)),
                 Fraction(0))
    return s + (1 - s) * sq


def worst_case_leakage(k: int, rounds: int) -> Fraction:
    """max over priors of 1 − τ: the uniform prior's (1 − s)(1 − 1/k)."""
    return (1 - survival(k, rounds)) * (1 - Fraction(1, k))


@dataclass(frozen=True)
class CategoricalRelease:
    """Per record: the final feasible set, each round's question and answer."""

    feasible: BoolArray  # (n, k)
    asked: BoolArray  # (n, rounds, k); all False after the record stopped
    answers: NDArray[np.int64]  # (n, rounds): 1 inclusion, 0 exclusion, -1 not asked
    rounds: NDArray[np.int64]  # questions answered

    @property
    def n(self) -> int:
        return int(self.feasible.shape[0])

    def contains(self, codes: ArrayLike) -> BoolArray:
        c = np.asarray(codes, dtype=np.int64)
        out: BoolArray = self.feasible[np.arange(c.shape[0]), c]
        return out

    def coverage(self, probs: ArrayLike) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.feasible.astype(np.float64) @ np.asarray(
            probs, dtype=np.float64)
        return out

    def pieces(self) -> Pieces:
        """Code c as the cell (c, c + 1]: a set is a union of such pieces (for the NPMLE)."""
        return masks_to_pieces(self.feasible)

    def table(self, probs: ArrayLike) -> dict[str, NDArray[Any]]:
        bits = np.int64(1) << np.arange(self.feasible.shape[1], dtype=np.int64)
        out: dict[str, NDArray[Any]] = {"set_mask": self.feasible.astype(np.int64) @ bits}
        for h in range(self.answers.shape[1]):
            out[f"asked_{h + 1}"] = self.asked[:, h, :].astype(np.int64) @ bits
            out[f"answer_{h + 1}"] = self.answers[:, h]
        out["rounds"] = self.rounds
        out["set_size"] = self.feasible.sum(axis=1).astype(np.int64)
        out["coverage"] = self.coverage(probs)
        return out


def masks_to_pieces(feasible: BoolArray) -> Pieces:
    n, k = feasible.shape
    codes = np.broadcast_to(np.arange(k, dtype=np.float64), (n, k))
    left = np.where(feasible, codes, np.nan)
    return Pieces(left, left + 1.0, np.zeros((n, k), bool), feasible.copy()).normalized(
    ).trimmed()


def masks_from_table(table: dict[str, NDArray[Any]], k: int) -> BoolArray:
    mask = np.asarray(table["set_mask"], dtype=np.int64)
    out: BoolArray = ((mask[:, None] >> np.arange(k, dtype=np.int64)) & 1).astype(bool)
    return out


@dataclass(frozen=True)
class ProgressiveCategorical:
    """Random-halving questions over k categories, at most ``rounds`` of them."""

    k: int
    rounds: int

    def __post_init__(self) -> None:
        if not 2 <= self.k <= MAX_CATEGORIES:
            raise ValueError(f"need 2 to {MAX_CATEGORIES} categories")
        if self.rounds < 1:
            raise ValueError("at least one round")

    def run(self, codes: ArrayLike, keys: NDArray[np.float64]) -> CategoricalRelease:
        """Deterministic given per-round random keys (n, rounds, k), drawn without the
        values: Q is the ⌈|S|/2⌉ feasible options with the smallest keys."""
        y = np.asarray(codes, dtype=np.int64)
        n, k = y.shape[0], self.k
        rows = np.arange(n)
        feasible = np.ones((n, k), bool)
        asked = np.zeros((n, self.rounds, k), bool)
        answers = np.full((n, self.rounds), -1, np.int64)
        done = np.zeros(n, np.int64)
        for h in range(self.rounds):
            size = feasible.sum(axis=1)
            active = size >= 2  # a rule on the released set only
            take = (size + 1) // 2
            key = np.where(feasible, keys[:, h, :], np.inf)
            rank = np.argsort(np.argsort(key, axis=1, kind="stable"), axis=1, kind="stable")
            q = feasible & (rank < take[:, None]) & active[:, None]
            yes = q[rows, y]
            new = np.where(yes[:, None], q, feasible & ~q)
            feasible = np.where(active[:, None], new, feasible)
            asked[:, h, :] = q
            answers[:, h] = np.where(active, yes.astype(np.int64), -1)
            done += active
        return CategoricalRelease(feasible, asked, answers, done)

    def release(self, codes: ArrayLike, rng: np.random.Generator) -> CategoricalRelease:
        y = np.asarray(codes, dtype=np.int64)
        return self.run(y, rng.random((y.shape[0], self.rounds, self.k)))

    def describe(self) -> dict[str, Any]:
        return {"partition": "progressive_categorical", "rounds": self.rounds,
                "categories": self.k,
                "questions": "is your answer one of Q? Q: ceil(|S|/2) of the feasible options"
                             " S, uniformly at random; yes: S <- Q, no: S <- S minus Q;"
                             " stops when one option is left"}


def category_npmle(feasible: BoolArray, tol: float = 1e-9,
                   max_iter: int | None = None) -> tuple[NDArray[np.float64], NPMLEResult]:
    """NPMLE of the category probabilities from released sets: max Σ_j log π(S_j)."""
    k = feasible.shape[1]
    res = npmle(masks_to_pieces(feasible), "em", tol=tol, max_iter=max_iter)
    probs = np.zeros(k)
    # candidate cells are (c, c + 1]; a cell the sets cannot split may span several codes
    for left, right, mass in zip(res.cell_left, res.cell_right, res.mass, strict=True):
        lo, hi = round(float(left)), round(float(right))
        probs[lo:hi] += mass / max(1, hi - lo)
    return probs, res
