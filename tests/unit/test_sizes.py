"""One parser for the sizes the engine holds as text (telefuser/sizes.py)."""

from __future__ import annotations

import pytest

from telefuser.sizes import parse_size


@pytest.mark.parametrize("text", ["832x480", "832X480", "832*480", " 832x480 "])
def test_width_then_height(text):
    assert parse_size(text) == (832, 480)


@pytest.mark.parametrize("text", ["832", "832x480x3", "wide", "832xabc", "", "x"])
def test_anything_else_names_the_form_and_what_it_was(text):
    with pytest.raises(ValueError, match=r"^resolution must be WIDTHxHEIGHT \(e\.g\. 1280x720\), got "):
        parse_size(text, what="resolution", example="1280x720")
