"""`telefuser serve`: OpenAI-style batch text-to-video+audio jobs (MiniMax H3) over `/v1/videos`.
`app.create_video_app(runner)` builds the service for any model that offers `contract.py`'s `VideoRunner`;
`minimax.py` is the real model's adapter, `fake.py` a test pattern with a tone. PROTOCOL.md has the fields and
limits."""
