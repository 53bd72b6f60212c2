"""`telefuser serve`: OpenAI-style batch text-to-video jobs over `/v1/videos` (MiniMax H3 with audio, Wan 2.2 without).
`app.create_video_app(runner)` builds the service for any model that offers `contract.py`'s `VideoRunner`;
`minimax.py` and `wan2_2.py` are the real models' adapters, `fake.py` a test pattern with a tone. PROTOCOL.md has the
fields and limits."""
