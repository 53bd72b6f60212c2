"""The LingBot-World v2 few-step schedule: 4 timesteps per chunk, x0 from the flow, re-noise to the next timestep.

Computed here in numpy float64 exactly as the reference computes it, because no diffusers scheduler gives its
timesteps; its two sigma lookups (and why they differ for one timestep) are in this folder's README, and the
numbers are pinned by tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

NUM_TRAIN_TIMESTEPS = 1000
SAMPLE_SHIFT = 10.0
TIMESTEP_INDICES = (0, 250, 500, 750)


def flow_unipc_tables(
    num_train_timesteps: int = NUM_TRAIN_TIMESTEPS, shift: float = SAMPLE_SHIFT
) -> tuple[torch.Tensor, torch.Tensor]:
    """(timesteps int64 [N], sigmas float32 [N + 1]) of the reference scheduler after ``set_timesteps(N, shift)``."""
    n = int(num_train_timesteps)
    if n < 2:
        raise ValueError(f"num_train_timesteps must be at least 2, got {num_train_timesteps}")
    if not shift > 0:
        raise ValueError(f"shift must be positive, got {shift}")
    # Constructor with shift=1: training sigmas 1 - linspace(1, 1/N, N) reversed, stored as float32.
    train_sigmas = (1.0 - np.linspace(1, 1 / n, n)[::-1]).astype(np.float32)
    sigma_max, sigma_min = float(train_sigmas[0]), float(train_sigmas[-1])
    # set_timesteps(N, shift): N points from sigma_max down to sigma_min (last dropped), shifted, in float64.
    sigmas = np.linspace(sigma_max, sigma_min, n + 1)[:-1]
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    timesteps = torch.from_numpy(sigmas * n).to(torch.int64)  # truncation toward zero, as the reference does
    return timesteps, torch.from_numpy(np.concatenate([sigmas, [0.0]]).astype(np.float32))


@dataclass(frozen=True)
class DenoisingSchedule:
    """Per-chunk steps: the DiT timestep, the sigma that turns its flow into x0, the sigma that re-noises x0."""

    timesteps: tuple[int, ...]  # what the DiT sees at each step, e.g. (999, 967, 908, 768)
    x0_sigmas: tuple[float, ...]  # float32 values held as Python floats (the reference upcasts them to float64)
    renoise_sigmas: tuple[float, ...]  # one per step transition: len(timesteps) - 1

    @classmethod
    def build(
        cls,
        indices: tuple[int, ...] = TIMESTEP_INDICES,
        shift: float = SAMPLE_SHIFT,
        num_train_timesteps: int = NUM_TRAIN_TIMESTEPS,
    ) -> DenoisingSchedule:
        timesteps, sigmas = flow_unipc_tables(num_train_timesteps, shift)
        indices = tuple(int(i) for i in indices)
        if not indices:
            raise ValueError("need at least one timestep index")
        for i in indices:
            if not 0 <= i < len(timesteps):
                raise ValueError(f"timestep index {i} is outside 0..{len(timesteps) - 1}")
        picked = [int(timesteps[i]) for i in indices]
        x0 = [float(sigmas[_first_index(timesteps, t)]) for t in picked]
        renoise = [float(sigmas[_reference_noise_index(timesteps, t)]) for t in picked[1:]]
        return cls(tuple(picked), tuple(x0), tuple(renoise))

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    def as_dict(self) -> dict:
        return {
            "timesteps": list(self.timesteps),
            "x0_sigmas": list(self.x0_sigmas),
            "renoise_sigmas": list(self.renoise_sigmas),
        }


def _first_index(timesteps: torch.Tensor, t: int) -> int:
    return int(torch.argmin((timesteps.double() - t).abs()))


def _reference_noise_index(timesteps: torch.Tensor, t: int) -> int:
    hits = (timesteps == t).nonzero().flatten()
    return int(hits[1] if len(hits) > 1 else hits[0])


def flow_to_x0(flow: torch.Tensor, x_t: torch.Tensor, sigma: float) -> torch.Tensor:
    """``x0 = x_t - sigma * flow`` in float64 (flow = noise - x0), returned as float32 like the latents."""
    return (x_t.double() - sigma * flow.double()).to(torch.float32)


def renoise(x0: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """``(1 - sigma) * x0 + sigma * noise`` with sigma in the sample's dtype (the reference's ``add_noise``)."""
    s = torch.tensor(sigma, dtype=x0.dtype, device=x0.device)
    return (1 - s) * x0 + s * noise
