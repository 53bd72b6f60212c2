"""MP4 writing (H.264 + AAC through PyAV) checked by reading the file back."""

from __future__ import annotations

import numpy as np
import pytest

from telefuser.media import probe_media, write_mp4


def _clip(frames: int = 12, height: int = 32, width: int = 48):
    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, size=(frames, height, width, 3), dtype=np.uint8)
    t = np.arange(int(32_000 * frames / 24)) / 32_000
    audio = np.stack([0.3 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 660 * t)]).astype(np.float32)
    return video, audio


def test_video_and_stereo_audio_round_trip(tmp_path):
    video, audio = _clip()
    info = probe_media(write_mp4(tmp_path / "a.mp4", video, 24, audio, 32_000))
    assert info.video_frames == 12 and info.fps == 24.0 and (info.width, info.height) == (48, 32)
    assert info.video_codec == "h264"
    assert info.has_audio and info.audio_codec == "aac" and info.sample_rate == 32_000 and info.channels == 2
    # AAC pads to whole 1024-sample frames (plus encoder priming); the content is all there.
    assert audio.shape[1] <= info.audio_samples <= audio.shape[1] + 3 * 1024
    assert info.duration_s == pytest.approx(0.5, abs=0.1)


def test_video_only_and_mono(tmp_path):
    video, audio = _clip(frames=5)
    assert not probe_media(write_mp4(tmp_path / "v.mp4", video)).has_audio
    info = probe_media(write_mp4(tmp_path / "m.mp4", video, 24, audio[:1], 32_000))
    assert info.channels == 1 and info.video_frames == 5


@pytest.mark.parametrize(
    "frames, audio",
    [
        (np.zeros((2, 31, 32, 3), np.uint8), None),  # odd height: yuv420p needs even sizes
        (np.zeros((2, 32, 32, 3), np.float32), None),  # not uint8
        (np.zeros((0, 32, 32, 3), np.uint8), None),  # no frames
        (np.zeros((2, 32, 32, 3), np.uint8), np.zeros((3, 100), np.float32)),  # three channels
    ],
)
def test_bad_inputs_are_refused(tmp_path, frames, audio):
    with pytest.raises(ValueError):
        write_mp4(tmp_path / "x.mp4", frames, 24, audio)
