"""Sampling presets: data the CLI and the service select by name; a preset fills in the request's DiT calls and
shifts, and the schedule it builds has exactly that many DiT calls."""

from __future__ import annotations

import pytest

from telefuser.pipelines.minimax_h3.presets import PRESETS, get_preset
from telefuser.pipelines.minimax_h3.scheduler import FlowSchedule


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_builds_a_schedule_of_its_dit_calls(name):
    preset = get_preset(name)
    schedule = FlowSchedule.build(preset.steps, preset.video_shift, preset.audio_shift)
    assert schedule.num_dit_calls == preset.dit_calls and preset.source


def test_the_release_preset_is_the_release_request_and_turbo_presets_are_short():
    assert get_preset("release").steps == 50
    assert (get_preset("turbo-8").dit_calls, get_preset("turbo-4").dit_calls) == (8, 4)


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown sampling preset 'turbo-2'; presets: release, turbo-8, turbo-4"):
        get_preset("turbo-2")
