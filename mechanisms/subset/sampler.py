"""Privatization: draw one released subset per record, vectorised.

Every output contains the record's true category (the mechanism is
faithful). The uniform design is sampled without listing its 2**p − 2p − 2
subsets: given X = j, every other category joins independently with
probability 1/2 and draws outside sizes 2..p−2 are redrawn, which is exactly
uniform on the subsets containing j — the law μ_a·1{j∈a} of the independent
mechanism (acceptance (2^{p−1}−p−1)/2^{p−1}: 3/8 at p = 4, → 1 as p grows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import Design, DesignError


def check_codes(x: ArrayLike, p: int) -> NDArray[np.int64]:
    """Category codes as int64 in [0, p); the error names no value."""
    codes = np.asarray(x)
    if codes.ndim != 1 or codes.dtype.kind not in "iu":
        raise ValueError("category codes must be a 1-D integer array")
    codes = codes.astype(np.int64, copy=False)
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= p):
        raise ValueError(f"category codes must lie in 0..{p - 1}")
    return codes


def privatize(x: ArrayLike, design: Design, rng: np.random.Generator) -> Masks:
    """Released subsets (uint64 masks) of the category codes ``x`` under ``design``."""
    codes = check_codes(x, design.p)
    if design.is_uniform:
        return uniform_rejection(codes, design.p, rng)
    if design.kind == "independent":
        masks, nu = design.nu()
        return independent(codes, masks, nu, design.p, rng)
    return conditional(codes, design, rng)


def uniform_rejection(x: NDArray[np.int64], p: int, rng: np.random.Generator) -> Masks:
    """The uniform design by rejection, for any p ≤ 63 (no enumeration)."""
    out = np.empty(len(x), dtype=np.uint64)
    own = bitmask.bit(x)
    pending = np.arange(len(x))
    top = bitmask.full(p)
    while pending.size:
        draw = rng.integers(0, top, size=pending.size, dtype=np.uint64, endpoint=True)
        draw |= own[pending]
        size = np.bitwise_count(draw)
        ok = (size >= 2) & (size <= p - 2)
        out[pending[ok]] = draw[ok]
        pending = pending[~ok]
    return out


def independent(
    x: NDArray[np.int64],
    masks: Masks,
    nu: NDArray[np.float64],
    p: int,
    rng: np.random.Generator,
) -> Masks:
    """Definition 3 by enumeration: Ã ~ ν, release Ã if it holds X, else Ã^c."""
    drawn = masks[rng.choice(len(masks), size=len(x), p=nu)]
    return np.where(bitmask.contains(drawn, x), drawn, bitmask.complement(drawn, p))


def conditional(x: NDArray[np.int64], design: Design, rng: np.random.Generator) -> Masks:
    """Definition 2: given X = j, draw a ∋ j with probability μ_a (one pass per category)."""
    masks, mu = design.law()
    out = np.empty(len(x), dtype=np.uint64)
    for j in range(design.p):
        rows = np.flatnonzero(x == j)
        if rows.size == 0:
            continue
        holds = bitmask.contains(masks, np.full(len(masks), j))
        candidates, probs = masks[holds], mu[holds]
        out[rows] = candidates[rng.choice(len(candidates), size=rows.size, p=probs / probs.sum())]
    return out


def enumerated(x: ArrayLike, design: Design, rng: np.random.Generator) -> Masks:
    """Reference sampler that lists the support (independent designs via ν, else μ).

    Slower than ``privatize`` for the uniform design; kept to check the
    rejection sampler against (the two must have the same law).
    """
    codes = check_codes(x, design.p)
    if design.is_independent:
        masks, nu = design.nu()
        return independent(codes, masks, nu, design.p, rng)
    return conditional(codes, design, rng)


def privatize_product(
    columns: Sequence[ArrayLike], designs: Sequence[Design], rng: np.random.Generator
) -> list[Masks]:
    """Definition 8: one design per column, each on its own child stream of ``rng``."""
    if len(columns) != len(designs):
        raise ValueError("give one design per column")
    streams = rng.spawn(len(columns))
    return [privatize(x, d, s) for x, d, s in zip(columns, designs, streams, strict=True)]


def survey_question(design: Design, rng: np.random.Generator, size: int | None = None) -> Masks:
    """Collection mode: the subsets Ã ~ ν to ask about ("is your value in Ã?")."""
    if not design.is_independent:
        raise DesignError("type", "a conditional design needs the true value; no survey form")
    count = 1 if size is None else size
    if design.is_uniform:
        p = design.p
        out = np.empty(count, dtype=np.uint64)
        pending = np.arange(count)
        while pending.size:
            draw = rng.integers(0, bitmask.full(p), size=pending.size, dtype=np.uint64,
                                endpoint=True)
            sizes = np.bitwise_count(draw)
            ok = (sizes >= 2) & (sizes <= p - 2)
            out[pending[ok]] = draw[ok]
            pending = pending[~ok]
    else:
        masks, nu = design.nu()
        out = masks[rng.choice(len(masks), size=count, p=nu)]
    return out


def survey_answer(question: ArrayLike, in_subset: ArrayLike, p: int) -> Masks:
    """The released subset from the one-bit answer: Ã if yes, Ã^c if no."""
    asked = bitmask.as_masks(question)
    return np.where(np.asarray(in_subset, dtype=bool), asked, bitmask.complement(asked, p))
