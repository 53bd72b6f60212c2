"""Wan 2.2 text(+image)-to-video: the denoise loop with its two experts, CFG and TI2V-5B's first frame (pipeline.py),
and its memory workload and assembly from a release folder or random weights (loading.py). The DiT is
`telefuser.models.wan2_2`; the text encoder, the VAE and the family's memory terms are `telefuser.pipelines.wan`'s."""
