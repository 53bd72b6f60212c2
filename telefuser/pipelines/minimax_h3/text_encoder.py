"""MiniMax H3 text encoder: the Qwen3-VL language model cut after layer 50, final norm removed.

H3 conditions on the unnormalized hidden state after language layer 50; this builds exactly that from public
`transformers` classes and reads only the tensors it needs from ``FL2VA/text_encoder`` (this folder's README has
the key mapping and what is skipped).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ...memory.host import to_host
from ...memory.streaming import StreamedLayers

SELECTED_LAYER = 50
OFFICIAL_TEXT_DIM = 5120
# Prefixes under which a full Qwen3-VL checkpoint stores its language model, most likely first.
LANGUAGE_MODEL_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")


def official_text_config():
    """Qwen3-VL-32B-class language config as used by H3 (values from the released text_encoder/config.json
    as quoted by public converters; used only to build random official-size weights without a checkpoint)."""
    from transformers import Qwen3VLTextConfig

    return Qwen3VLTextConfig(
        vocab_size=151936,
        hidden_size=OFFICIAL_TEXT_DIM,
        intermediate_size=25600,
        num_hidden_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=5_000_000.0,
        max_position_embeddings=262144,
        rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    )


def tiny_text_config(hidden_size: int = 64, num_layers: int = 2, vocab_size: int = 512):
    """A few-layer config for CPU tests and demos; same classes and code path as the official one."""
    from transformers import Qwen3VLTextConfig

    head_dim = 16
    return Qwen3VLTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // head_dim,
        num_key_value_heads=max(1, hidden_size // head_dim // 2),
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        rope_theta=5_000_000.0,
        max_position_embeddings=4096,
        # mrope sections split head_dim / 2 rotary frequencies over (t, h, w); text-only positions are equal on
        # all three axes, so the split does not change the result, but the config must carry one.
        rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True},
    )


class MiniMaxH3TextEncoder(nn.Module):
    """`Qwen3VLTextModel` with `num_layers` layers and no final norm; returns the last hidden state."""

    def __init__(self, config, num_layers: int = SELECTED_LAYER) -> None:
        super().__init__()
        from transformers import Qwen3VLTextModel

        if num_layers < 1 or num_layers > config.num_hidden_layers:
            raise ValueError(f"cannot keep {num_layers} of {config.num_hidden_layers} language layers")
        config = config.__class__.from_dict(config.to_dict())  # never mutate the caller's config
        config.num_hidden_layers = num_layers
        config.use_cache = False
        self.config = config
        self.model = Qwen3VLTextModel(config)
        self.model.norm = nn.Identity()  # H3 uses the unnormalized layer output

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, L] token ids -> [B, L, hidden] layer-`num_layers` hidden state."""
        out = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False)
        return out.last_hidden_state

    @classmethod
    def random(
        cls,
        config,
        *,
        num_layers: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        host_from: int | None = None,
    ) -> MiniMaxH3TextEncoder:
        """Deterministic random weights, drawn on `device` one tensor at a time (no host copy of a large model).
        `host_from`: the token embedding and layers ``host_from:`` go to host memory as they are drawn (the
        encoder then streams them: `Qwen3VLPromptEncoder(streamed_from=...)`)."""
        from accelerate import init_empty_weights

        with init_empty_weights():
            encoder = cls(config, num_layers)
        device = torch.device(device)
        generator = torch.Generator(device=device).manual_seed(seed)
        std = float(getattr(config, "initializer_range", 0.02))
        for name, param in encoder.model.named_parameters():
            if name.endswith("norm.weight"):
                value = torch.ones(param.shape, device=device, dtype=dtype)
            else:
                value = (torch.randn(param.shape, generator=generator, device=device) * std).to(dtype)
            value = to_host(value) if on_host(name, host_from) else value
            encoder.model.load_state_dict({name: value}, strict=False, assign=True)
        _reset_rotary(encoder, device)
        return encoder.eval()

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        num_layers: int = SELECTED_LAYER,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        host_from: int | None = None,
    ) -> MiniMaxH3TextEncoder:
        """Load the first `num_layers` language layers of a full Qwen3-VL checkpoint folder, one tensor at a time;
        `host_from` as in `random`."""
        from accelerate import init_empty_weights
        from transformers import Qwen3VLConfig

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json; expected the checkpoint's text_encoder folder")
        config = Qwen3VLConfig.from_pretrained(str(path), local_files_only=True).text_config
        with init_empty_weights():
            encoder = cls(config, num_layers)
        wanted = encoder.model.state_dict().keys()
        state = _read_language_tensors(path, wanted, device=device, dtype=dtype, host_from=host_from)
        encoder.model.load_state_dict(state, strict=True, assign=True)
        _reset_rotary(encoder, device)
        return encoder.eval()


def on_host(name: str, host_from: int | None) -> bool:
    """Whether `Qwen3VLTextModel` tensor `name` lives in host memory when layers ``host_from:`` stream: those
    layers and the token embedding (looked up on the host)."""
    if host_from is None:
        return False
    if name.startswith("embed_tokens."):
        return True
    parts = name.split(".")
    return parts[0] == "layers" and int(parts[1]) >= host_from


def _reset_rotary(encoder: MiniMaxH3TextEncoder, device: str | torch.device) -> None:
    """Rebuild the rotary tables on `device`: they are computed buffers, never stored in a checkpoint."""
    rotary = encoder.model.rotary_emb
    with torch.device(device):  # transformers 5 dropped the `device` argument; the default device works in 4.x and 5.x
        encoder.model.rotary_emb = rotary.__class__(encoder.config)


def _read_language_tensors(
    folder: Path, wanted, *, device: str | torch.device, dtype: torch.dtype, host_from: int | None = None
) -> dict[str, torch.Tensor]:
    """Read only the tensors `wanted` (Qwen3VLTextModel names) from the shards, mapping checkpoint prefixes."""
    from safetensors import safe_open

    shards = _shard_files(folder)
    prefix = _detect_prefix(shards)
    wanted = set(wanted)
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                if not key.startswith(prefix):
                    continue
                name = key[len(prefix) :]
                if name in wanted:
                    tensor = handle.get_tensor(key).to(dtype=dtype)
                    state[name] = to_host(tensor) if on_host(name, host_from) else tensor.to(device)
    missing = sorted(wanted - state.keys())
    if missing:
        raise ValueError(
            f"text encoder checkpoint {folder} lacks {len(missing)} language-model tensors under prefix "
            f"{prefix!r}, e.g. {missing[:3]}"
        )
    return state


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in names]
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no safetensors files in {folder}")
    return shards


def _detect_prefix(shards: list[Path]) -> str:
    from safetensors import safe_open

    probe = "embed_tokens.weight"
    for shard in shards:
        with safe_open(str(shard), framework="pt", device="cpu") as handle:
            keys = set(handle.keys())
        for prefix in LANGUAGE_MODEL_PREFIXES:
            if prefix + probe in keys:
                return prefix
    raise ValueError(
        f"no language-model token embedding found in {shards[0].parent}; looked for "
        f"{[p + probe for p in LANGUAGE_MODEL_PREFIXES]}"
    )


class Qwen3VLPromptEncoder:
    """Tokenizer + text encoder: a prompt to the DiT's text conditioning [1, L, text_dim].

    `streamed_from`: layers ``streamed_from:`` live in pinned host memory and stream to the device one at a time
    while a prompt is encoded (`StreamedLayers`), and the token embedding is looked up on the host: the official
    encoder is 47 GiB and runs once per request, while the DiT needs the device for the rest of it. None: the
    whole encoder stays on its device.
    """

    def __init__(
        self, tokenizer, encoder: MiniMaxH3TextEncoder, *, streamed_from: int | None = None, device=None
    ) -> None:
        if tokenizer.vocab_size > encoder.vocab_size:
            raise ValueError(
                f"tokenizer vocabulary ({tokenizer.vocab_size}) is larger than the text encoder's "
                f"({encoder.vocab_size})"
            )
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.stream = None
        if streamed_from is not None:
            model = encoder.model
            model.embed_tokens.weight.data = to_host(model.embed_tokens.weight.data)
            self.stream = StreamedLayers(
                model.layers, device, resident=streamed_from, keep_slots=False, spread=False
            ).attach()

    @property
    def offload(self) -> bool:
        return self.stream is not None

    @property
    def hidden_size(self) -> int:
        return self.encoder.hidden_size

    def __call__(self, prompt: str, device: torch.device) -> torch.Tensor:
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string")
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise ValueError(f"prompt {prompt!r} produced no tokens")
        if self.stream is None:
            return self.encoder(torch.tensor([ids], dtype=torch.long, device=device))
        model = self.encoder.model
        embeds = model.embed_tokens(torch.tensor([ids], dtype=torch.long)).to(device)  # the table stays on the host
        try:
            with torch.no_grad():
                out = model(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], device=device))
            return out.last_hidden_state
        finally:
            self.stream.reset()  # after an error too: every layer back on its host copy, the slots freed
