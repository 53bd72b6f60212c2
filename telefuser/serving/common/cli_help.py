"""How every `telefuser` command reads its flags: `--help` shows each flag's default, and a mistake on the command
line is one line (`telefuser serve: error: ...; see telefuser serve --help`, exit status 2) instead of the usage
block first. Importing this module imports neither FastAPI nor torch.
"""

from __future__ import annotations

import argparse
import sys


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults in the help, except where they say nothing (None, a switch's False, a suppressed default)
    or the help already states the default in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._VersionAction))
            or (not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{text} (default: {shown})" if text else f"default: {shown}"


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, and whose help shows defaults (unless told otherwise); its
    subcommands are parsers of the same kind."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs):
        kwargs.setdefault("parser_class", OneLineErrorParser)
        return super().add_subparsers(**kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message}; see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)
