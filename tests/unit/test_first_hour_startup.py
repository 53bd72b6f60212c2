"""Issue 36: every start-up mistake ends in one line that says what is wrong and what to do, with exit status 2 and
no traceback. Each case runs `telefuser serve` in a subprocess, as a user would (an optional package is made missing
by putting None in its `sys.modules` slot before the command runs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def serve(tmp_path: Path, *args: str, missing: tuple[str, ...] = (), env: dict | None = None) -> list[str]:
    """`telefuser serve ARGS` with the modules in `missing` made unimportable; the lines of its stderr (after
    checking that it exited with 2 and printed no traceback)."""
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in missing)
    prelude += "from telefuser.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    argv = ["serve", "--artifacts", str(tmp_path / "out"), "--port", "0", *args]
    done = subprocess.run(
        [sys.executable, "-c", prelude, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("telefuser serve: error: "), done.stderr[-3000:]
    assert sum("error" in line for line in lines) == 1, done.stderr[-3000:]
    return lines


def test_cuda_asked_for_where_torch_has_none(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.is_available() else {}  # a GPU host: hide its GPUs
    line = serve(tmp_path, "--config", "tiny", "--device", "cuda", env=env)[-1]
    assert "--device cuda: " in line and "pass --device cpu" in line, line


def test_a_checkpoint_that_is_not_one(tmp_path):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    line = serve(tmp_path, "--device", "cpu", "--checkpoint", str(empty))[-1]
    assert f"{empty} is not a MiniMax H3 checkpoint" in line and "check --checkpoint" in line, line
    assert "'Weights'" in line, line  # where to look


def test_a_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = serve(tmp_path, "--fake", "--port", str(port))[-1]
    assert f"port {port} on 127.0.0.1 is already in use" in line and "--port 0 picks a free one" in line, line


@pytest.mark.parametrize(
    ("args", "missing", "expected"),
    [
        (
            ("--fake", "--job-store", "postgresql://nobody@127.0.0.1:1/none"),
            ("psycopg",),
            "--job-store postgresql://... needs the Python package 'psycopg'",
        ),
        (
            ("--config", "tiny", "--device", "cpu", "--attn-impl", "flash_attn_4"),
            ("flash_attn",),
            "--attn-impl flash_attn_4: attention implementation 'flash_attn_4' was asked for but flash-attn-4 is "
            "not installed",
        ),
        (("--fake",), ("telefuser.serving.video.cli",), "the services need their packages"),
    ],
    ids=["psycopg", "flash-attn-4", "service-stack"],
)
def test_a_missing_optional_package(tmp_path, args, missing, expected):
    line = serve(tmp_path, *args, missing=missing)[-1]
    assert expected in line, line
    assert "pip install" in line or "install it" in line, line  # what to do


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--fake", "--s3-endpoint", "http://127.0.0.1:1"), "--s3-endpoint needs --artifacts s3://bucket/prefix"),
        (("--fake", "--lora-scale-range", "2", "1"), "--lora-scale-range MIN MAX needs MIN <= MAX"),
        (("--fake", "--no-such-flag"), "unrecognized arguments: --no-such-flag; see telefuser serve --help"),
    ],
    ids=["s3-endpoint-without-s3", "scale-range", "unknown-flag"],
)
def test_flags_that_do_not_go_together(tmp_path, args, expected):
    lines = serve(tmp_path, *args)
    assert len(lines) == 1 and expected in lines[0], lines  # no usage block either


def test_parallel_degrees_that_do_not_match_the_launched_ranks_are_a_mistake_not_a_fault():
    """Every rank builds from the same flags, so each one ends with the same line (torchrun then reports the exit)."""
    from telefuser.distributed.mesh import ParallelConfigError
    from telefuser.serving.common.startup import StartupError, explain_build_error

    mistake = explain_build_error(ParallelConfigError("world size 2 does not match ulysses_degree x tp_degree = 1"))
    assert isinstance(mistake, StartupError)
    assert mistake.code == (
        "world size 2 does not match ulysses_degree x tp_degree = 1; --ulysses-degree x --tp-degree must equal the "
        "ranks torchrun starts (--nproc-per-node)"
    )
    assert explain_build_error(RuntimeError("a fault")) is None  # the control: a fault keeps its traceback


EXAMPLES = ("examples/wan2_2/run_t2v.py", "examples/minimax_h3/run_t2va.py", "examples/lingbot_world_v2/run_i2v.py")


@pytest.mark.parametrize("script", EXAMPLES)
def test_an_example_given_an_attention_it_cannot_run_ends_in_one_line(script):
    """The examples end a start-up mistake as `telefuser serve` does: here `--attn-impl sage_sm90` where it cannot
    run (this CPU-only run has no CUDA GPU), before any weight is built."""
    from telefuser.ops.attention_registry import get_backend

    if get_backend("sage_sm90").available()[0]:
        pytest.skip("sage_sm90 runs on this machine: the mistake under test cannot be made here")
    done = subprocess.run(
        [sys.executable, script, "--config", "tiny", "--device", "cpu", "--attn-impl", "sage_sm90"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    name = Path(script).name
    assert f"{name}: error: attention implementation 'sage_sm90' was asked for but" in done.stderr
    assert "pass --attn-impl auto" in done.stderr.splitlines()[-1]


def test_run_example_lets_a_fault_show_its_traceback():
    """Only what `explain_build_error` knows as a mistake becomes one line; anything else is a fault and raises."""
    from telefuser.serving.common.startup import run_example

    def broken() -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_example(broken)
    assert run_example(lambda: None) == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--fake", "--port", "99999"), "argument --port: must be 0 to 65535, got 99999"),
        (("--fake", "--max-steps", "0"), "argument --max-steps: must be 1 or more, got 0"),
        (("--fake", "--max-image-mib", "-2"), "argument --max-image-mib: must be positive, got -2"),
        (("--fake", "--lora-scale-range", "-1", "nan"), "argument --lora-scale-range: 'nan' is not a finite number"),
        (("--fake", "--ulysses-degree", "0"), "argument --ulysses-degree/--gpu-num: must be 1 or more, got 0"),
    ],
    ids=["port", "max-steps", "max-image-mib", "lora-scale-nan", "ulysses-degree"],
)
def test_a_number_out_of_range_is_a_usage_error(tmp_path, args, expected):
    """Before, a port past 65535 ended in a traceback, and the others started a service that refused every request."""
    lines = serve(tmp_path, *args)
    assert len(lines) == 1 and expected in lines[0], lines


def test_every_numeric_flag_of_every_command_is_range_checked():
    """A flag typed plain int or float takes 0, negatives, NaN or infinity; each has a telefuser.arg_types type."""
    import argparse

    from telefuser.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    plain = [
        f"telefuser {name} {action.option_strings[0]}"
        for name, parser in commands.items()
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert plain == []
    assert len(commands) >= 4  # serve, serve-stream, plan, info at least: the scan saw the commands


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("examples/wan2_2/run_t2v.py", ("--steps", "0"), "argument --steps: must be 1 or more, got 0"),
        ("examples/minimax_h3/run_t2va.py", ("--steps", "1"), "argument --steps: must be 2 or more, got 1"),
        ("examples/lingbot_world_v2/run_i2v.py", ("--fps", "0"), "argument --fps: must be 1 or more, got 0"),
    ],
    ids=["wan-steps", "minimax-steps", "lingbot-fps"],
)
def test_an_example_given_a_number_out_of_range_ends_in_one_line(script, args, expected):
    """Before: Wan 2.2 wrote a clip of no denoising step, the other two ended in a ValueError traceback."""
    assert example_mistake(script, *args).startswith(f"{Path(script).name}: error: {expected}")


def example_mistake(script: str, *args: str) -> str:
    """The last stderr line of `script --config tiny --device cpu ARGS`, after checking that it ended with status 2
    and no traceback."""
    done = subprocess.run(
        [sys.executable, script, "--config", "tiny", "--device", "cpu", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--fake", "--size-default", "0x64"), "argument --size-default: width and height must be positive, got 0x64"),
        (
            ("--fake", "--seconds-default", "20"),
            "a request that leaves size, seconds and steps out would be refused: 'seconds' is 20; this server allows "
            "at most 10 s",
        ),
        (("--fake", "--steps-default", "2000"), "'num_inference_steps' is 2,000; this server allows at most 1000"),
    ],
    ids=["size-zero", "seconds-past-the-limit", "steps-past-the-limit"],
)
def test_request_defaults_the_service_would_refuse(tmp_path, args, expected):
    """Before, the service started and answered every request that left the field out with a 422 for the server's
    own flag."""
    lines = serve(tmp_path, *args)
    assert expected in lines[-1], lines


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--config", "tiny", "--resolution", "100x100"),
            "the session defaults: resolution 100x100: width and height must be positive ",
        ),
        (("--config", "tiny", "--num-frames", "3"), "the session defaults: num_frames must be 1 + 4k"),
        (
            ("--config", "tiny", "--resolution", "12x"),
            "argument --resolution: the size must be WIDTHxHEIGHT (e.g. 832x480), got '12x'",
        ),
        (
            ("--fake", "--resolution", "2048x2048", "--max-width", "1024"),
            "a session that leaves resolution, num_frames and fps out would be refused: resolution 2048x2048 is 2048 "
            "pixels wide; the limit is max_width=1,024",
        ),
    ],
    ids=["resolution-not-a-multiple", "num-frames", "resolution-unreadable", "past-a-limit"],
)
def test_session_defaults_the_stream_service_cannot_make(args, expected):
    """Before: a ValueError traceback from the memory plan, or a service that answered every create with a 422."""
    done = subprocess.run(
        [sys.executable, "-m", "telefuser.cli", "serve-stream", "--device", "cpu", "--port", "0"] + list(args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1].startswith("telefuser serve-stream: error: " + expected), done.stderr[-3000:]


def test_an_artifacts_directory_that_cannot_be_made(tmp_path):
    """Under a file: refused before the model is built. In a pseudo filesystem (/proc refuses even root): refused when
    the store opens, in one line. Before, the second was a FileNotFoundError traceback."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    lines = serve(tmp_path, "--fake", "--artifacts", str(a_file / "videos"))
    assert lines == [f"telefuser serve: error: --artifacts {a_file / 'videos'}: {a_file} is not a directory"]
    line = serve(tmp_path, "--fake", "--artifacts", "/proc/telefuser-videos")[-1]
    assert (
        line
        == "telefuser serve: error: --artifacts /proc/telefuser-videos: cannot create or use it (No such file or directory)"
    )


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        (
            "examples/minimax_h3/run_t2va.py",
            ("--resolution", "abc"),
            "resolution must be a short edge or WIDTHxHEIGHT, got 'abc'",
        ),
        (
            "examples/lingbot_world_v2/run_i2v.py",
            ("--resolution", "100x100"),
            "resolution 100x100: width and height must be positive multiples of 16",
        ),
        ("examples/lingbot_world_v2/run_i2v.py", ("--image", "/nonexistent.png"), "reference image not found"),
        (
            "examples/minimax_h3/run_t2va.py",
            ("--output", "/proc/telefuser/out.mp4"),
            "--output /proc/telefuser/out.mp4: cannot create /proc/telefuser (No such file or directory)",
        ),
        ("examples/wan2_2/run_t2v.py", ("--output", "/tmp"), "--output /tmp is a directory; name a file"),
    ],
    ids=["minimax-resolution", "lingbot-resolution", "lingbot-image", "minimax-output", "wan-output"],
)
def test_an_example_refuses_a_request_or_an_output_it_cannot_make_before_it_runs(script, args, expected):
    """Before: a ValueError traceback, or (the output) minutes of generation lost when the MP4 could not be written."""
    assert example_mistake(script, *args).startswith(f"{Path(script).name}: error: {expected}")
