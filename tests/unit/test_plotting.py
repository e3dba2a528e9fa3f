"""The function drawing is a real PNG of the given size."""

from __future__ import annotations

import struct

from service.plotting import function_png


def test_png_has_the_expected_size() -> None:
    png = function_png([0.0, 0.5, 1.0], [1.0, 0.2, 0.7], "iclp.mean · rel_x")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (600, 350)
