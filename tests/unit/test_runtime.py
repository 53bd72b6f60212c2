"""telefuser.runtime on one CPU process: the flags, the defaults, a layout that needs torchrun, parallelize."""

from __future__ import annotations

import argparse

import pytest
import torch

from telefuser.runtime import Runtime, add_runtime_args


def _args(*argv: str, tp: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_runtime_args(parser, tp=tp)
    return parser.parse_args(list(argv))


def test_one_process_runs_dense_on_the_cpu_in_float32(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    runtime = Runtime.from_args(_args("--device", "cpu"))
    assert runtime.mesh is None and (runtime.rank, runtime.world_size) == (0, 1)
    assert runtime.device == torch.device("cpu") and runtime.dtype == torch.float32 and runtime.dtype_name == "float32"
    assert runtime.parallel.world_size == 1
    assert Runtime.from_args(_args("--device", "cpu", "--dtype", "bfloat16")).dtype == torch.bfloat16

    class Spec:
        def parallelize(self, model, mesh, *, communicator_factory=None):
            raise AssertionError("a one-rank launch split a model")

    model = object()
    assert runtime.parallelize(model, Spec()) is model


def test_a_layout_that_needs_more_ranks_names_the_torchrun_command(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match=r"ulysses x tp = 4 ranks: launch with torchrun --nproc-per-node=4"):
        Runtime.from_args(_args("--ulysses-degree", "2", "--tp-degree", "2"))
    assert not hasattr(_args(tp=False), "tp_degree")
    assert _args("--gpu-num", "3", tp=False).ulysses_degree == 3  # the reference's flag name
