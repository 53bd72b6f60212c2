"""The prompt -> umT5-XXL encoder states ``[1, text_len, 4096]`` (transformers' ``UMT5EncoderModel``), once per session.

The encoder runs on the real tokens and the states are zero-padded to ``text_len``: what the reference's masked
encoder gives the DiT. The tokenizer is the checkpoint's (or a byte-level stand-in that says so) and
`official_t5_to_hf` maps Wan's weight names; both are described in this folder's README.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import torch

from ...memory.host import to_host
from ...memory.streaming import StreamedLayers

TEXT_LEN = 512
TOKENIZER_SUBDIR = "google/umt5-xxl"
# umT5-XXL encoder (Wan's `umt5_xxl`: dim 4096, ffn 10240, 64 heads, 24 layers, vocab 256384, 32 buckets).
OFFICIAL_UMT5 = {
    "vocab_size": 256384,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "layer_norm_epsilon": 1e-6,
    "dropout_rate": 0.0,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}


def tiny_umt5_config(d_model: int = 32) -> dict:
    if d_model % 4:
        raise ValueError(f"tiny text width must be a multiple of 4, got {d_model}")
    return dict(
        OFFICIAL_UMT5, vocab_size=384, d_model=d_model, d_kv=d_model // 4, d_ff=2 * d_model, num_layers=2, num_heads=4
    )


def clean_prompt(text: str) -> str:
    """Wan's 'whitespace' cleaning: ftfy (when installed), HTML-unescape twice, strip, collapse whitespace."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:  # ftfy only repairs mojibake; clean UTF-8 prompts are unchanged by it
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class ByteFallbackTokenizer:
    """UTF-8 bytes shifted past pad (0), EOS (1) and unk (2), then EOS: stable everywhere, needs no files."""

    RESERVED = 3
    EOS = 1

    def __init__(self) -> None:
        self.vocab_size = 256 + self.RESERVED
        self.description = "byte-level fallback tokenizer (no tokenizer files given; not the umT5 vocabulary)"

    def encode(self, text: str, max_length: int) -> list[int]:
        return [b + self.RESERVED for b in text.encode("utf-8")][: max_length - 1] + [self.EOS]


class UMT5Tokenizer:
    """The checkpoint's ``google/umt5-xxl`` tokenizer, local files only."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        path = Path(path)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (ImportError, ValueError, OSError) as exc:
            raise ValueError(
                f"cannot load the umT5 tokenizer from {path}: {exc}. It needs tokenizer.json (or the "
                f"'sentencepiece' package to read spiece.model)"
            ) from None
        self.vocab_size = len(self._tokenizer)
        self.description = f"umT5 tokenizer from {path}"

    def encode(self, text: str, max_length: int) -> list[int]:
        out = self._tokenizer(text, add_special_tokens=True, truncation=True, max_length=max_length)
        return list(out["input_ids"])


def load_tokenizer(path: str | Path | None):
    """The tokenizer in `path` (the ``google/umt5-xxl`` folder), or the byte fallback when `path` is None."""
    if path is None:
        return ByteFallbackTokenizer()
    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    return UMT5Tokenizer(path)


def build_umt5_encoder(config: dict, *, seed: int = 0, device="cpu", dtype=torch.float32, host_from: int | None = None):
    """A `UMT5EncoderModel` with deterministic random weights, drawn on `device` one tensor at a time. `host_from`:
    the token embedding and blocks ``host_from:`` go to host memory as they are drawn (the encoder then streams
    them: `UMT5PromptEncoder(streamed_from=...)`)."""
    from accelerate import init_empty_weights
    from transformers import UMT5Config, UMT5EncoderModel

    with init_empty_weights():
        model = UMT5EncoderModel(UMT5Config(**config))
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():  # the tied embedding is listed once, as shared.weight
        if name.endswith("layer_norm.weight"):
            value = torch.ones(param.shape, device=device, dtype=dtype)
        else:  # T5-like scales: embeddings ~1, projections ~1/sqrt(fan_in)
            std = 1.0 if "shared" in name or "embed" in name else param.shape[-1] ** -0.5
            value = (torch.randn(param.shape, generator=generator, device=device, dtype=torch.float32) * std).to(dtype)
        model.load_state_dict({name: to_host(value) if on_host(name, host_from) else value}, strict=False, assign=True)
    model.tie_weights()
    return model.eval().requires_grad_(False)


def on_host(name: str, host_from: int | None) -> bool:
    """Whether `UMT5EncoderModel` tensor `name` lives in host memory when blocks ``host_from:`` stream: those
    blocks and the (tied) token embedding, looked up on the host."""
    if host_from is None:
        return False
    if name in ("shared.weight", "encoder.embed_tokens.weight"):
        return True
    parts = name.split(".")
    return parts[:2] == ["encoder", "block"] and int(parts[2]) >= host_from


def place_umt5(model, device, host_from: int | None):
    """A host-loaded `UMT5EncoderModel` placed tensor by tensor: `on_host` ones pinned, the rest on `device`."""
    device = torch.device(device)
    for name, tensor in model.named_parameters():
        tensor.data = to_host(tensor.data) if on_host(name, host_from) else tensor.data.to(device)
    model.tie_weights()
    return model


def official_t5_to_hf(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Wan's umT5 encoder state dict -> `UMT5EncoderModel` names (the map is in README.md); strict."""
    per_block = {
        "norm1.weight": "layer.0.layer_norm.weight",
        "attn.q.weight": "layer.0.SelfAttention.q.weight",
        "attn.k.weight": "layer.0.SelfAttention.k.weight",
        "attn.v.weight": "layer.0.SelfAttention.v.weight",
        "attn.o.weight": "layer.0.SelfAttention.o.weight",
        "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
        "norm2.weight": "layer.1.layer_norm.weight",
        "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
        "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
        "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
    }
    mapping = {"token_embedding.weight": "shared.weight", "norm.weight": "encoder.final_layer_norm.weight"}
    for i in range(num_layers):
        for src, dst in per_block.items():
            mapping[f"blocks.{i}.{src}"] = f"encoder.block.{i}.{dst}"
    unexpected = sorted(set(state) - set(mapping))
    missing = sorted(set(mapping) - set(state))
    if unexpected or missing:
        raise ValueError(
            f"umT5 checkpoint does not match a {num_layers}-layer umT5 encoder in Wan's layout: "
            f"{len(missing)} missing {missing[:5]}, {len(unexpected)} unmapped {unexpected[:5]}"
        )
    out = {mapping[k]: v for k, v in state.items()}
    out["encoder.embed_tokens.weight"] = out["shared.weight"]
    return out


def load_official_umt5(
    path: str | Path, *, device="cpu", dtype=torch.bfloat16, config: dict | None = None, host_from: int | None = None
):
    """``models_t5_umt5-xxl-enc-bf16.pth`` -> `UMT5EncoderModel` on `device`, one tensor at a time (`host_from` as
    in `build_umt5_encoder`)."""
    from accelerate import init_empty_weights
    from transformers import UMT5Config, UMT5EncoderModel

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"umT5 encoder checkpoint not found: {path}")
    config = dict(config or OFFICIAL_UMT5)
    try:  # memory-map the 11 GB file where the format allows it (zip format, torch >= 1.6)
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    mapped = official_t5_to_hf(state, int(config["num_layers"]))
    with init_empty_weights():
        model = UMT5EncoderModel(UMT5Config(**config))
    expected = model.state_dict()
    mis_shaped = [
        (k, tuple(v.shape), tuple(expected[k].shape))
        for k, v in mapped.items()
        if tuple(v.shape) != tuple(expected[k].shape)
    ]
    if mis_shaped:
        raise ValueError(f"{path}: tensors of the wrong shape for umT5-XXL: {mis_shaped[:3]}")
    for name in list(mapped):
        value = mapped.pop(name).to(dtype=dtype)
        mapped[name] = to_host(value) if on_host(name, host_from) else value.to(device)
    model.load_state_dict(mapped, strict=True, assign=True)
    model.tie_weights()
    return model.eval().requires_grad_(False)


def load_pretrained_umt5(path: str | Path, *, device="cpu", dtype=torch.bfloat16, host_from: int | None = None):
    """A transformers-format ``text_encoder/`` folder -> `UMT5EncoderModel` on `device` (local files only; read on
    the host, then placed: `host_from` as in `build_umt5_encoder`)."""
    from transformers import UMT5EncoderModel

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no umT5 encoder at {path}: config.json is missing")
    model = UMT5EncoderModel.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return place_umt5(model, device, host_from).eval().requires_grad_(False)


class UMT5PromptEncoder:
    """Tokenizer + umT5 encoder: prompt -> ``[1, text_len, d_model]`` (real rows, then zeros).

    `streamed_from`: blocks ``streamed_from:`` live in pinned host memory and stream to `device` one at a time while
    a prompt is encoded (`StreamedLayers`), and the token embedding is looked up on the host. None: the encoder
    runs where its weights are."""

    def __init__(
        self, tokenizer, encoder, *, text_len: int = TEXT_LEN, streamed_from: int | None = None, device=None
    ) -> None:
        vocab = int(encoder.config.vocab_size)
        if tokenizer.vocab_size > vocab:
            raise ValueError(f"tokenizer vocabulary ({tokenizer.vocab_size}) exceeds the encoder's ({vocab})")
        if text_len < 1:
            raise ValueError(f"text_len must be positive, got {text_len}")
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.text_len = int(text_len)
        self.stream = None
        if streamed_from is not None:
            self.stream = StreamedLayers(
                encoder.encoder.block, device, resident=streamed_from, keep_slots=False, spread=False
            ).attach()
            self.device = torch.device(device)

    @property
    def hidden_size(self) -> int:
        return int(self.encoder.config.d_model)

    @torch.no_grad()
    def __call__(self, prompt: str, device: torch.device | str, *, allow_empty: bool = False) -> torch.Tensor:
        """`allow_empty`: an empty prompt encodes to its end-of-text token alone (a CFG negative prompt's default)."""
        if not isinstance(prompt, str) or not (prompt.strip() or allow_empty):
            raise ValueError("prompt must be a non-empty string")
        ids = self.tokenizer.encode(clean_prompt(prompt), self.text_len)
        if self.stream is None:
            encoder_device = next(self.encoder.parameters()).device
            input_ids = torch.tensor([ids], dtype=torch.long, device=encoder_device)
            states = self.encoder(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state
        else:
            embeds = self.encoder.shared(torch.tensor([ids], dtype=torch.long)).to(self.device)  # host lookup
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=self.device)
            try:
                states = self.encoder(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
            finally:
                self.stream.reset()  # after an error too: every block back on its host copy, the slots freed
        context = states.new_zeros(1, self.text_len, states.shape[-1])
        context[:, : states.shape[1]] = states
        return context.to(device)
