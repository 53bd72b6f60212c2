"""telefuser.arg_types: the range each numeric flag type accepts, at its edges, and the message past them."""

from __future__ import annotations

import argparse

import pytest

from telefuser.arg_types import (
    finite_float,
    int_at_least,
    int_in,
    non_negative_float,
    port,
    positive_float,
    positive_int,
)


@pytest.mark.parametrize(
    ("kind", "accepted", "refused"),
    [
        (port, {"0": 0, "65535": 65535}, {"-1": "must be 0 to 65535", "65536": "must be 0 to 65535"}),
        (positive_int, {"1": 1, "7": 7}, {"0": "must be 1 or more", "1.5": "'1.5' is not an integer"}),
        (int_at_least(2), {"2": 2}, {"1": "must be 2 or more"}),
        (int_in(1, 95), {"1": 1, "95": 95}, {"0": "must be 1 to 95", "96": "must be 1 to 95"}),
        (positive_float, {"0.001": 0.001, "1e3": 1000.0}, {"0": "must be positive", "-0.5": "must be positive"}),
        (non_negative_float, {"0": 0.0, "2.5": 2.5}, {"-1e-9": "must be 0 or more", "inf": "not a finite number"}),
        (finite_float, {"-4": -4.0, "4": 4.0}, {"nan": "'nan' is not a finite number", "x": "'x' is not a number"}),
    ],
    ids=["port", "positive_int", "int_at_least", "int_in", "positive_float", "non_negative_float", "finite_float"],
)
def test_edges(kind, accepted, refused):
    for text, value in accepted.items():
        assert kind(text) == value and type(kind(text)) is type(value)
    for text, message in refused.items():
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            kind(text)
