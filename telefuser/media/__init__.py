"""Writing and probing media files (MP4 with H.264 video and AAC audio) through PyAV."""

from .mp4 import MediaInfo, probe_media, write_mp4

__all__ = ["MediaInfo", "probe_media", "write_mp4"]
