"""`--model` for a service: the registered models it can serve, and the flags of each, declared by the model's spec.

Every servable model's flags are on the command line (one help group per model; a flag two models share, such as
--checkpoint, is listed once), with no default at parse time. `chosen_spec` then resolves --model, refuses a flag
the chosen model does not take, and fills in the chosen model's defaults.
"""

from __future__ import annotations

import argparse

from ...models import registry
from ...models.spec import ModelSpec


def _model_name(service: str):
    def check(name: str) -> str:
        try:
            return registry.get_spec(name, service).name
        except registry.UnknownModelError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    check.__name__ = "model"  # argparse names the type in its messages
    return check


def add_model_args(parser: argparse.ArgumentParser, *, service: str, default: str) -> None:
    """--model NAME, with the models a `service` ("video" | "stream") service can serve, and their flags."""
    specs = [registry.get_spec(name) for name in registry.names(service)]
    listed = "; ".join(f"{spec.name}: {spec.title}" for spec in specs)
    parser.add_argument_group("model").add_argument(
        "--model", type=_model_name(service), default=default, help=f"the model to serve (default {default}); {listed}"
    )
    shown: dict[str, str] = {}  # option name -> the help it is listed with (the first model's that declares it)
    for spec in specs:
        own = [flag for flag in spec.flags if not set(flag.names) & set(shown)]
        shared = [_shared_note(spec, flag, shown) for flag in spec.flags if flag not in own]
        about = f"taken with --model {spec.name}"
        if shared:  # listed under an earlier model: say so, with this model's own help where it differs
            about += f"; also these, listed above: {', '.join(shared)}"
        group = parser.add_argument_group(f"{spec.name} flags", about)
        for flag in own:
            # filled in by chosen_spec for the chosen model; --help still shows that model's default
            flag.add_to(group, default=argparse.SUPPRESS, **_help_with_default(spec, flag))
            shown.update(dict.fromkeys(flag.names, _help_text(spec, flag)))


def _help_text(spec: ModelSpec, flag) -> str:
    """The flag's help as `spec` gives it, its default filled in."""
    default = spec.serve_defaults.get(flag.dest, flag.default)
    return str(flag.options.get("help", "")).replace("%(default)s", str(default)).replace("%%", "%")


def _shared_note(spec: ModelSpec, flag, shown: dict[str, str]) -> str:
    """A flag listed under another model: its name, and this model's help when that says something else."""
    name, text = flag.names[0], _help_text(spec, flag)
    return name if text == shown.get(name) else f"{name} (here: {text})"


def _help_with_default(spec: ModelSpec, flag) -> dict[str, str]:
    """{"help": ...} naming the default `spec` gives the flag, where its help does not say it already."""
    text = flag.options.get("help")
    default = spec.serve_defaults.get(flag.dest, flag.default)
    if text is None or default in (None, False) or "default" in text.lower() or "%(default)" in text:
        return {}
    return {"help": f"{text} (default: {default})"}


def chosen_spec(args: argparse.Namespace, *, service: str, command: str) -> ModelSpec:
    """The spec of --model; its flags' defaults (the spec's `serve_defaults` first) are set on `args` where not given.
    A flag given for another model, or a value the chosen model does not take, ends the command with the reason."""
    spec = registry.get_spec(args.model, service)
    own = {flag.dest: flag for flag in spec.flags}
    others = {
        flag.dest: flag.names[0]
        for name in registry.names(service)
        for flag in registry.get_spec(name).flags
        if flag.dest not in own
    }
    foreign = [option for dest, option in others.items() if dest in vars(args)]
    if foreign:
        raise SystemExit(
            f"telefuser {command}: {', '.join(foreign)} is not a flag of --model {spec.name} "
            f"(its flags: {', '.join(spec.flag_names())})"
        )
    for dest, flag in own.items():
        if dest not in vars(args):
            setattr(args, dest, spec.serve_defaults.get(dest, flag.default))
        elif "choices" in flag.options and getattr(args, dest) not in flag.options["choices"]:
            choices = ", ".join(map(str, flag.options["choices"]))
            raise SystemExit(f"telefuser {command}: --model {spec.name} takes {flag.names[0]} {{{choices}}}")
    return spec
