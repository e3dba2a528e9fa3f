""""Did you mean ...?" for a misspelt public name (mechanism, column, measure).

Only public names are ever suggested (the registry, a dataset's public metadata), and only
close ones (``difflib``'s ratio at least 0.6), so an error message names what the caller
most likely meant without listing everything there is.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(str(name), sorted(set(choices)), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
