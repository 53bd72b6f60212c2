"""LoRA merging under TP2 (gloo, CPU): each rank merges only its slice of every split weight (the rows of B for the
column splits QKV, fc1 and the AdaLN projection; the columns of A for the row splits out_proj and fc2), and that
slice equals the same slice of the dense merged weight; unmerging restores the rank's slices exactly, FP8 included.

Bound: both sides run the same fp32 operations on the same numbers (``W + c * (B @ A)``, elementwise the same
multiply and add), except that the rank's GEMM has other shapes (``B[rows] @ A`` vs ``B @ A``; ``B @ A[:, cols]``),
for which a BLAS may pick another kernel and so another summation order of each rank-r dot product. Per element the
two then differ by at most ``2 * r * u * sum_k |c b_k a_k|`` (u = 2^-24, summed over the stacked LoRAs) before the
add, and one rounding of the sum (``u * |W'|``) each: that is the bound, checked element by element. Measured: 0
(bit-identical) on this host. Negative control: the other rank's slice, far outside it.
"""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from torch import nn

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit
from telefuser.models.minimax_h3.dit import MiniMaxH3DiT
from telefuser.models.minimax_h3.lora import keep_dense_weights, merge, read_lora, unmerge
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.models.minimax_h3.tp import shard_tensor
from telefuser.ops.fp8 import Float8Linear

CONFIG = MiniMaxH3Config.tiny()
U = 2.0**-24
SCALES = (0.8, -0.3)


def _write_loras(directory) -> list[str]:
    """Two ai-toolkit LoRAs over every linear of the tiny DiT (ranks 4 and 3), written once by the parent."""
    with torch.device("meta"):
        model = MiniMaxH3DiT(CONFIG)
    shapes = {name: tuple(m.weight.shape) for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    paths = []
    for seed, rank in ((1, 4), (2, 3)):
        g = torch.Generator().manual_seed(seed)
        tensors = {}
        for name, (rows, columns) in shapes.items():
            tensors[f"diffusion_model.{name}.lora_A.weight"] = torch.randn(rank, columns, generator=g) / columns**0.5
            tensors[f"diffusion_model.{name}.lora_B.weight"] = torch.randn(rows, rank, generator=g) * 0.3
        path = directory / f"lora{seed}.safetensors"
        save_file(tensors, str(path))
        paths.append(str(path))
    return paths


def _rank_slices(ctx, paths):
    mesh = build_mesh(ParallelConfig(ulysses_degree=1, tp_degree=2))
    loras = [(read_lora(p), s) for p, s in zip(paths, SCALES)]
    dense = build_random_minimax_h3_dit(CONFIG, seed=0)
    merge(dense, loras)
    model = MINIMAX_H3.parallelize(build_random_minimax_h3_dit(CONFIG, seed=0), mesh)
    tp = model.tensor_parallel
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merge(model, loras)
    within, identical, split, control = [], 0, 0, []
    dense_state = dense.state_dict()
    for key, local in model.state_dict().items():
        expected = shard_tensor(key, dense_state[key], tp.rank, tp.size)
        assert local.shape == expected.shape, key
        if local.shape != dense_state[key].shape:
            split += 1
            other = shard_tensor(key, dense_state[key], 1 - tp.rank, tp.size)
            control.append(bool(((other - expected).abs() > _bound(key, loras, expected, tp)).any()))
        within.append(bool(((local - expected).abs() <= _bound(key, loras, expected, tp)).all()))
        identical += int(torch.equal(local, expected))
    unmerge(model)
    restored = all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    model.close()
    return all(within), identical, len(within), split, all(control), restored


def _bound(key: str, loras, expected: torch.Tensor, tp) -> torch.Tensor:
    """Element by element: the GEMM's other summation order, then one rounding of the merged sum."""
    name, _, leaf = key.rpartition(".")
    magnitude = torch.zeros_like(expected)
    for lora, scale in loras:
        update = lora.modules.get(name)
        if leaf == "weight" and update is not None:
            full = update.rank * abs(scale * update.scale) * (update.up.abs() @ update.down.abs())
            magnitude += shard_tensor(key, full, tp.rank, tp.size)
    return 2.0 * U * magnitude + 2.0 * U * expected.abs()


def test_tp2_each_rank_merges_exactly_its_slice(ranks2, tmp_path):
    paths = _write_loras(tmp_path)
    for within, identical, total, split, control, restored in ranks2.run(_rank_slices, paths):
        assert within and restored and control
        # split: per block QKV, out_proj, fc1, fc2 and the AdaLN weight and bias; per refiner block the first four;
        # the final AdaLN weight and bias
        assert split == 6 * CONFIG.num_layers + 4 * CONFIG.token_refiner_num_layers + 2
        assert 0 < identical <= total  # the unsplit, untouched tensors at least (measured: all of them)


def _fp8_rank(ctx, paths):
    mesh = build_mesh(ParallelConfig(ulysses_degree=1, tp_degree=2))
    loras = [(read_lora(p), s) for p, s in zip(paths, SCALES)]
    # merged on the rank's bf16 slices, then quantized: what the FP8 merge must give
    merged_first = MINIMAX_H3.parallelize(build_random_minimax_h3_dit(CONFIG, seed=0, dtype=torch.bfloat16), mesh)
    merge(merged_first, loras)
    merged_first.quantize("fp8")
    model = MINIMAX_H3.parallelize(build_random_minimax_h3_dit(CONFIG, seed=0, dtype=torch.bfloat16), mesh)
    keep_dense_weights(model)
    model.quantize("fp8")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merge(model, loras)
    expected = merged_first.state_dict()
    same = all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    unmerge(model)
    restored = all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    fp8 = sum(isinstance(m, Float8Linear) for m in model.modules())
    fp8_names = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    kept = {tuple(t.shape) for n, t in model.lora_state.dense.items() if n in fp8_names}  # each rank's slices
    model.close()
    merged_first.close()
    return same, restored, fp8, kept


def test_tp2_fp8_merge_requantizes_the_rank_slices_and_unmerges_exactly(ranks2, tmp_path):
    paths = _write_loras(tmp_path)
    for same, restored, fp8, kept in ranks2.run(_fp8_rank, paths):
        assert same and restored
        assert fp8 == 4 * CONFIG.num_layers
        inner = CONFIG.num_attention_heads * CONFIG.attention_head_dim
        hidden, ffn = CONFIG.hidden_size, CONFIG.ffn_hidden_size
        assert kept == {(3 * inner // 2, hidden), (hidden, inner // 2), (ffn, hidden), (hidden, ffn // 2)}
