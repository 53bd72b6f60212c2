"""Request -> latents -> frames/audio: one package per model (schedulers, stages, the pipeline object).

Nothing is imported here on purpose: importing `telefuser.pipelines` must stay cheap and must not pull in a model's
weights code. Import the model's package directly, e.g.
``from telefuser.pipelines.minimax_h3 import MiniMaxH3Pipeline``.
"""
