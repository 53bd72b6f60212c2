"""Named sampling presets for MiniMax H3: how many DiT calls and which flow shifts a request uses.

Step-distilled ("Turbo") LoRAs run H3 in 4-8 DiT calls instead of the release's 49; which preset a LoRA was trained
for is the user's choice (its model card says), never guessed from a file name. The presets and their sources are in
examples/minimax_h3/README.md ("Sampling presets"). The sampler itself is the release's (`scheduler.FlowSchedule`): a preset
only fills in the request's step count and shifts. H3 runs without classifier-free guidance (one packed branch), so
a CFG-distilled LoRA needs no guidance switch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .scheduler import DEFAULT_AUDIO_FLOW_SHIFT, DEFAULT_NUM_STEPS, DEFAULT_VIDEO_FLOW_SHIFT


@dataclass(frozen=True)
class SamplingPreset:
    name: str
    dit_calls: int
    video_shift: float
    audio_shift: float
    source: str  # where the numbers come from, for --help and the docs

    @property
    def steps(self) -> int:
        """The request's sigma points: N points give N-1 DiT calls."""
        return self.dit_calls + 1


PRESETS: dict[str, SamplingPreset] = {
    p.name: p
    for p in (
        SamplingPreset(
            "release",
            DEFAULT_NUM_STEPS - 1,
            DEFAULT_VIDEO_FLOW_SHIFT,
            DEFAULT_AUDIO_FLOW_SHIFT,
            "the release's request example: 50 sigma points, shifts 12 (video) and 3 (audio)",
        ),
        SamplingPreset(
            "turbo-8",
            8,
            DEFAULT_VIDEO_FLOW_SHIFT,
            DEFAULT_AUDIO_FLOW_SHIFT,
            "8 DiT calls with a Turbo LoRA at strength 1.0 (ComfyUI's H3 turbo_mode), the release's shifts 12/3 (the "
            "training shift lightx2v's Turbo files state)",
        ),
        SamplingPreset(
            "turbo-4",
            4,
            DEFAULT_VIDEO_FLOW_SHIFT,
            DEFAULT_AUDIO_FLOW_SHIFT,
            "4 DiT calls, the low end of the Turbo LoRAs' 4-8 (larryvrh/MiniMax-H3-Turbo-Lora; the 4-step ComfyUI run "
            "on one RTX 5090), shifts 12/3",
        ),
    )
}


def get_preset(name: str) -> SamplingPreset:
    preset = PRESETS.get(name)
    if preset is None:
        raise ValueError(f"unknown sampling preset {name!r}; presets: {', '.join(PRESETS)}")
    return preset
