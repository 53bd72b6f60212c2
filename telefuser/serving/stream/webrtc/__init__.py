"""WebRTC delivery of a stream session (`serve-stream --webrtc`, aiortc): one peer connection per session, a video
track the service encodes itself with PyAV (encoder.py) and paces at the session's FPS (track.py), and a data channel
that carries the same JSON status events and client messages as the WebSocket (peer.py). `settings.py` holds what the
service needs without importing aiortc, which is an optional dependency."""
