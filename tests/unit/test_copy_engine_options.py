"""CopyEngineOptions' timeout from TELEFUSER_ULYSSES_TIMEOUT_S: a value that is not a usable number of seconds is an
error naming the variable, not float()'s bare message or a timeout that fires at once."""

from __future__ import annotations

import pytest

from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions


def test_the_variable_sets_the_timeout(monkeypatch):
    monkeypatch.setenv("TELEFUSER_ULYSSES_TIMEOUT_S", "42.5")
    assert CopyEngineOptions().timeout_s == 42.5
    monkeypatch.delenv("TELEFUSER_ULYSSES_TIMEOUT_S")
    assert CopyEngineOptions().timeout_s == 600.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ten", "TELEFUSER_ULYSSES_TIMEOUT_S must be a number of seconds, got 'ten'"),
        ("0", "timeout_s must be positive, got 0.0"),
        ("-5", "timeout_s must be positive, got -5.0"),
        ("nan", "timeout_s must be positive, got nan"),
    ],
)
def test_a_value_that_is_not_a_timeout_is_refused(monkeypatch, value, message):
    monkeypatch.setenv("TELEFUSER_ULYSSES_TIMEOUT_S", value)
    with pytest.raises(ValueError, match=message):
        CopyEngineOptions()
