"""Start-up mistakes end in one line and exit status 2: what is wrong and what to do, never a traceback.

A mistake is a `StartupError` (a `SystemExit` carrying its message, so code that raises one ends the process even
where nothing catches it); `run_cli` prints any message-carrying `SystemExit` as `telefuser CMD: error: ...` and
returns 2. The checks here run before a model is built, so a wrong flag costs seconds, not a checkpoint load:
`check_device` (CUDA asked for where torch has none), `check_port` (the port taken), `check_attention` (an attention
package that is not installed), `require_package` (an optional package a flag needs). `explain_build_error` turns
what a model builder raises for a bad checkpoint or configuration into such a line.

Importing this module imports neither FastAPI nor torch.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import socket
import sys
from collections.abc import Callable

EXIT_MISTAKE = 2
# What a model builder raises for a checkpoint or configuration it cannot use (class names, so the models' packages
# are not imported here): each is the user's to fix, with the hint beside it.
_BUILD_MISTAKES = {
    "CheckpointError": "check --checkpoint: the README's 'Weights' section says what each model reads",
    "VAECheckpointError": "check --checkpoint: the README's 'Weights' section says what each model reads",
    "LayoutError": "check --checkpoint (a re-exported DiT may need --qkv-layout)",
    "FileNotFoundError": "check --checkpoint: the README's 'Weights' section says what each model reads",
    "NotADirectoryError": "--checkpoint takes a directory: the README's 'Weights' section says which",
    "MiniMaxH3ConfigError": "check --config and the parallel degrees (--tp-degree, --ulysses-degree)",
    "LingBotConfigError": "check --config, --checkpoint and --ulysses-degree",
    "WanConfigError": "check --config, --checkpoint and --ulysses-degree",
    "MemoryPlanError": "see `telefuser plan --help` for what fits",
    "ParallelConfigError": "--ulysses-degree x --tp-degree must equal the ranks torchrun starts (--nproc-per-node)",
    "DiffusersVersionError": "install the diffusers version pyproject.toml names (pip install -e .)",
    "AttentionBackendError": "pass one of the implementations named, or --attn-impl auto",
    "AttentionUnavailableError": "install it (README: 'On GPUs') or pass --attn-impl auto",
}


class StartupError(SystemExit):
    """A start-up mistake: `message` says what is wrong and what to do."""

    def __init__(self, message: str):
        super().__init__(message)


def run_cli(func: Callable[[argparse.Namespace], int], args: argparse.Namespace, command: str) -> int:
    """`func(args)`, with a message-carrying SystemExit (a StartupError, or any `raise SystemExit("...")`) printed
    as one line on stderr and turned into exit status 2."""
    try:
        return func(args)
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        return _report(one_line(command, exc.code))


def check_output_file(path, flag: str = "--output") -> None:
    """`path` can be written: its directory exists or can be made, and is writable (checked before a run of minutes
    whose result would be lost at the end). Creates the directory, as the write would."""
    import os
    from pathlib import Path

    directory = Path(path).absolute().parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"{flag} {path}: cannot create {directory} ({exc.strerror or exc})") from None
    if Path(path).is_dir():
        raise StartupError(f"{flag} {path} is a directory; name a file")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StartupError(f"{flag} {path}: {directory} is not writable by this user")


def run_example(main: Callable[[], int | None]) -> int:
    """An example script's `main()`, with a start-up mistake (a message-carrying SystemExit, or what
    `explain_build_error` recognises) printed as one line, `<script>: error: ...`, and exit status 2."""
    import os

    try:
        return main() or 0
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        message = exc.code
    except Exception as exc:
        mistake = explain_build_error(exc)
        if mistake is None:
            raise
        message = mistake.code
    return _report(_one_line(f"{os.path.basename(sys.argv[0])}: ", message))


def one_line(command: str, message: str) -> str:
    """`telefuser CMD: error: MESSAGE` (a message that already names the command keeps it once)."""
    return _one_line(f"telefuser {command}: " if command else "telefuser: ", message)


def _one_line(prefix: str, message: str) -> str:
    text = " ".join(message.split())  # one line, whatever the message held
    return f"{prefix}error: {text.removeprefix(prefix).removeprefix('error: ')}"


def _report(line: str) -> int:
    print(line, file=sys.stderr, flush=True)
    return EXIT_MISTAKE


def check_device(device: str | None) -> None:
    """A --device that this torch cannot use: a CUDA device on a torch without CUDA or with no GPU visible, an
    index past the GPUs there are, or a name torch does not know."""
    if device is None:
        return
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise StartupError(f"--device {device!r} is not a device torch knows; pass cpu, cuda or cuda:N") from None
    if parsed.type != "cuda":
        return
    if torch.version.cuda is None:
        raise StartupError(
            f"--device {device}: this torch ({torch.__version__}) is a CPU-only build; pass --device cpu, or install "
            f"a CUDA build of torch (README: 'On GPUs')"
        )
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise StartupError(
            f"--device {device}: torch {torch.__version__} sees no CUDA GPU (check nvidia-smi and "
            f"CUDA_VISIBLE_DEVICES); pass --device cpu to run without one"
        )
    if parsed.index is not None and parsed.index >= count:
        raise StartupError(f"--device {device}: this host has {count} visible GPU(s) (cuda:0..cuda:{count - 1})")


def check_port(host: str, port: int) -> None:
    """The address must be free to bind (checked again when the server binds it: this one is early, before the
    model loads)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise StartupError(bind_failure(host, port, exc)) from None
    finally:
        sock.close()


def bind_failure(host: str, port: int, exc: OSError) -> str:
    """What a failed bind means and what to do about it."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use (another server is listening there); stop it, or pass "
            f"--port N (--port 0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges to bind; pass --port 1024 or higher"
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return f"--host {host} is not an address of this machine; pass --host 127.0.0.1 or 0.0.0.0"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}; pass another --host or --port"


def check_attention(impl: str | None) -> None:
    """An explicit --attn-impl whose package is not installed here (`auto` picks among those that are)."""
    if impl in (None, "auto"):
        return
    from telefuser.ops.attention_registry import check_backend

    try:
        check_backend(impl)
    except (ValueError, RuntimeError) as exc:
        raise StartupError(f"--attn-impl {impl}: {exc}; install it (README: 'On GPUs') or pass --attn-impl auto")


def require_package(module: str, *, flag: str, install: str) -> None:
    """An optional package that `flag` needs: imported now, so a missing one ends the command before any work."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise StartupError(f"{flag} needs the Python package {module!r}, which is missing ({exc}); {install}") from None


def explain_build_error(exc: BaseException) -> StartupError | None:
    """A model builder's exception that is a start-up mistake, as one; None for anything else (a fault: let its
    traceback show)."""
    for cls in type(exc).__mro__:
        hint = _BUILD_MISTAKES.get(cls.__name__)
        if hint is not None:
            return StartupError(f"{exc}; {hint}")
    if isinstance(exc, ImportError) and exc.name and not exc.name.startswith("telefuser"):
        return StartupError(f"the Python package {exc.name!r} is missing ({exc}); pip install it, or see the README")
    return None
