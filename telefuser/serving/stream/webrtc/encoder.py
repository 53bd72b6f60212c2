"""A session's video encoder: PyAV (libvpx VP8 or libx264 H.264) in real-time mode, capped at the service's bitrate.

Hopper GPUs have no NVENC, so frames are encoded on the CPU, in the session's own thread, each handed to the track
as soon as it is encoded (the first frame of a chunk goes out while the rest encode). One packet per frame (no
lookahead, no B-frames), a keyframe every `keyframe_interval_s`: the track hands the packets to aiortc as they are,
so a lost packet heals at the next keyframe rather than on a keyframe request.
"""

from __future__ import annotations

import fractions
import time

import numpy as np

LIBRARIES = {"vp8": "libvpx", "h264": "libx264"}


class ChunkEncoder:
    def __init__(
        self, codec: str, *, width: int, height: int, fps: float, max_bitrate: int, keyframe_interval_s: float
    ):
        import av

        self.codec_name = codec
        self.context = av.CodecContext.create(LIBRARIES[codec], "w")
        self.context.width, self.context.height, self.context.pix_fmt = width, height, "yuv420p"
        self.context.time_base = fractions.Fraction(1, 90_000)
        self.context.framerate = fractions.Fraction(round(fps * 1000), 1000)
        self.context.bit_rate = max_bitrate
        self.context.gop_size = max(1, round(fps * keyframe_interval_s))
        rate = str(max_bitrate)
        if codec == "vp8":  # aiortc's own real-time VP8 settings, with our cap
            options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0", "error-resilient": "1"}
        else:  # baseline profile: what every browser decodes; no B-frames, no lookahead
            options = {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline"}
        self.context.options = {**options, "maxrate": rate, "bufsize": rate}
        self.context.thread_count = 2
        self.frames = 0
        self.seconds = 0.0

    def encode(self, frame: np.ndarray):
        """uint8 [H, W, 3] -> its av.Packet (the pts is set when the track sends it)."""
        import av

        t0 = time.perf_counter()
        video = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24").reformat(format="yuv420p")
        video.pts = self.frames  # any increasing pts; the track stamps the send time
        self.frames += 1
        out = self.context.encode(video)
        if len(out) != 1:
            raise RuntimeError(f"the {self.codec_name} encoder gave {len(out)} packets for one frame, not 1")
        self.seconds += time.perf_counter() - t0
        return out[0]
