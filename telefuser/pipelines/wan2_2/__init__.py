"""Wan 2.2 text-to-video: the denoise loop with its two experts and CFG, and its assembly from a release folder or
random weights. The DiT is `telefuser.models.wan2_2`; the text encoder and VAE are `telefuser.pipelines.wan`'s."""
