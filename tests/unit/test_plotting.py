"""The function drawing is a real PNG of the given size."""

from __future__ import annotations

import struct

from service.plotting import function_png


def test_png_has_the_expected_size() -> None:
    png = function_png([0.0, 0.5, 1.0], [1.0, 0.2, 0.7], "iclp.mean · rel_x")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (600, 350)


def test_table_bars_with_error_bars_are_a_png() -> None:
    """Symmetric half-widths, [below, above] pairs and missing cells (None) all draw."""
    from service.plotting import bar_png

    for values, errors in (([3.0, 5.0, 1.0], [1.5, 1.5, 1.5]),
                           ([0.2, None, 0.7], [[0.1, 0.2], None, [0.3, 0.1]])):
        png = bar_png(["a / x", "a / y", "b / x"], values, errors, "laplace · rel_x")
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (600, 350)
