"""Extreme random tapes: generators whose first words are forced, the rest fair.

A mechanism turns its random tape (64-bit words) into noise. An exact sampler
maps a tape starting with j zero words to a draw about j·44 scale units deep
in its tail (U < 2^-64j; ``mechanisms.sampling`` takes a word's top bit as
the sign, so a word with only that bit set starts a deep negative draw); a
sampler built on numpy's ``standard_exponential`` never leaves 44.43 scale
units whatever the tape. Running the real code path on such tapes shows how
far a mechanism *can* reach, which no number of fair runs shows (the tail
beyond 44 units has probability e^-44). The tail family
(``events.support_gap``) uses these reaches; they are only for auditing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from randomgen import UserBitGenerator

_Z, _O, _S, _F = 0, (1 << 64) - 1, 1 << 63, None
#: forced prefixes (None: a fair word, so signs and cases drawn before the deep word vary);
#: a sign word (_S) then zero words reaches as deep on the negative side;
PREFIXES: tuple[tuple[int | None, ...], ...] = (
    (_Z,), (_Z, _Z), (_Z, _Z, _Z), (_Z, _Z, _Z, _Z), (_F, _Z, _Z, _Z), (_F, _F, _Z, _Z, _Z),
    (_O,), (_O, _O), (_O, _Z, _Z, _Z), (_Z, _O, _Z, _Z, _Z),
    (_S,), (_S, _Z), (_S, _Z, _Z, _Z), (_F, _S, _Z, _Z), (_O, _S, _Z, _Z),
)


def tape(prefix: Sequence[int | None], seed: int | list[int]) -> np.random.Generator:
    """A generator whose first raw 64-bit words are ``prefix`` (None: fair), then PCG64 words."""
    fair = np.random.default_rng(seed).bit_generator
    forced = list(prefix)[::-1]

    def next_raw(_: Any) -> int:
        word = forced.pop() if forced else None
        return int(fair.random_raw()) if word is None else word

    return np.random.Generator(UserBitGenerator(next_raw, 64))


def extreme_tapes(per_prefix: int, seed: int) -> Iterator[np.random.Generator]:
    """``per_prefix`` tapes for each forced prefix of ``PREFIXES`` (seeded fair tails)."""
    for i, prefix in enumerate(PREFIXES):
        for k in range(per_prefix):
            yield tape(prefix, [seed, i, k])


def reach(release: Callable[[np.random.Generator], np.ndarray], per_prefix: int,
          seed: int) -> np.ndarray:
    """Releases (one row per tape) of ``release`` on the extreme tapes."""
    rows = [np.asarray(release(g), dtype=np.float64).ravel()
            for g in extreme_tapes(per_prefix, seed)]
    return np.stack(rows)
