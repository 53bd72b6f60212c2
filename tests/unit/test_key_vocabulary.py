"""The LingBot key vocabulary is the model's (models/lingbot_world_v2/controls.py). The AIPerf plugin runs in its own
environment, which cannot import telefuser (no torch there), so it keeps a mirror of the keys a client may send: this
test keeps the mirror equal to the model's table."""

from __future__ import annotations

from telefuser.models.lingbot_world_v2.controls import (
    ACCEPTED_KEYS,
    CONTROL_KEYS,
    KEY_ACTIONS,
    KEY_ALIASES,
    KEY_BINDINGS,
    canonical_key,
    normalize_keys,
)
from tools.aiperf.telefuser_aiperf import controls as plugin_controls


def test_the_aiperf_plugins_keys_mirror_the_models_bindings():
    assert tuple(plugin_controls.ALLOWED_KEYS) == tuple(KEY_BINDINGS)


def test_every_binding_and_alias_reaches_the_action_of_its_canonical_key():
    for name, action in KEY_BINDINGS.items():
        assert KEY_ACTIONS[canonical_key(name)] == action, name
    for alias, key in KEY_ALIASES.items():
        assert canonical_key(alias) == key and canonical_key(alias.lower()) == key
    assert set(ACCEPTED_KEYS) == set(CONTROL_KEYS) | set(KEY_ALIASES)
    assert normalize_keys(["l", "ArrowUp", "KeyW", "w"]) == ("W", "L")
    assert canonical_key("Space") is None and canonical_key(3) is None
