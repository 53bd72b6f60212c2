"""TeleFuser-style inference for video diffusion transformers: Ulysses sequence parallelism on Hopper hosts."""

__version__ = "0.1.0"
