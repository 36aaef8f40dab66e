"""Options from a config file (YAML or JSON, e.g. a settings file the app's Runs tab exports) for the command line:
each key checked as its command-line form would be (unknown keys, wrong types, choices), the message naming the key;
options given on the command line win."""
from __future__ import annotations

import argparse
from pathlib import Path

from .errors import CALMError


def apply_config_file(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> None:
    import yaml

    try:
        options = yaml.safe_load(Path(args.config).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CALMError(f"Could not read the config file {args.config}: {exc}") from exc
    if not isinstance(options, dict):
        raise CALMError(f"{args.config} must hold option: value lines, got {type(options).__name__}.")
    options = {str(k).replace("-", "_"): v for k, v in options.items()}
    actions = {a.dest: a for a in parser._subparsers._group_actions[0].choices[args.command]._actions}
    unknown = sorted(set(options) - set(actions) - {"config"})
    if unknown:
        raise CALMError(f"{args.config}: unknown option{'s' * (len(unknown) > 1)} {', '.join(unknown)}; "
                        f"`python -m calm_core {args.command} --help` lists them.")
    explicit = {a.dest for a in actions.values() if any(opt in argv for opt in a.option_strings)}
    for key, value in options.items():
        if key not in explicit and key != "config":
            setattr(args, key, _config_value(args.config, actions[key], value))


def _config_value(source: str, action: argparse.Action, value):
    """One option from a config file, checked as its command-line form would be: the message names the key."""
    key = action.dest
    if action.nargs == 0:  # a flag
        if not isinstance(value, bool):
            raise CALMError(f"{source}: {key} must be true or false, got {value!r}.")
        return value
    if value is None:
        return None
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [str(v) for v in items]
    if getattr(action.type, '__name__', '') == '_column_map' and isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if getattr(action.type, '__name__', '') == '_int_list' and isinstance(value, list):
        value = ",".join(str(v) for v in value)
    if action.type is not None:
        whole = action.type is int and isinstance(value, float) and not value.is_integer()
        try:
            if isinstance(value, (bool, dict, list)) or whole:
                raise ValueError
            value = action.type(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            kind = {int: "a whole number", float: "a number"}.get(action.type, "a valid value")
            raise CALMError(f"{source}: {key} must be {kind}, got {value!r}.") from None
    if action.choices is not None and value not in action.choices:
        raise CALMError(f"{source}: {key} must be one of {', '.join(map(str, action.choices))}, got {value!r}.")
    return value
