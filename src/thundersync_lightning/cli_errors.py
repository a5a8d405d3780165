"""Command-line errors in a few lines: the problem, the valid choices, a "did you mean" for near misses.

jsonargparse answers a typo with the whole usage (some 75 lines) and then a nested report of
every union member it tried; a :class:`~thundersync_lightning.core.errors.ConfigError` raised
while the run is set up arrives at the end of a 50-line traceback. Here both become::

    thundersync-lightning fit: --trainer.strategy.init_args.max_open_grups: ThunderSyncStrategy has no
    option 'max_open_grups' (did you mean 'max_open_groups'?)
      valid options: mode, max_open_groups, ...
      (`thundersync-lightning fit --help` lists every option; THUNDERSYNC_TRACEBACK=1 shows the full report)

:func:`short_parse_error` reads jsonargparse's report (unknown arguments, an option a class does not
accept, a value outside a ``Literal``, a value of the wrong type, a class path that does not
import); anything else keeps the report's own lines, without the usage. Exit status 2, as argparse.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from lightning.pytorch.cli import LightningArgumentParser
from typing_extensions import override

from .core.options import trl_hint

__all__ = [
    "TRACEBACK_ENV",
    "ShortArgumentParser",
    "ShortErrorParser",
    "short_parse_error",
    "short_config_error",
    "did_you_mean",
]

#: Set to 1 for the parser's full report and the traceback of set-up errors.
TRACEBACK_ENV = "THUNDERSYNC_TRACEBACK"


def wants_traceback() -> bool:
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def class_options(class_path: str) -> list[str]:
    """The keyword options of a class path's constructor (empty when it does not import)."""
    module, _, attr = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
        params = inspect.signature(cls).parameters.values()
    except (ImportError, AttributeError, ValueError, TypeError):
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _short_class(class_path: str) -> str:
    return class_path.rpartition(".")[2]


def _unrecognized(args: str, keys: Sequence[str]) -> list[str]:
    options = [f"--{k}" for k in keys]
    lines = []
    for arg in args.split():
        if not arg.startswith("--"):
            lines.append(f"unexpected argument {arg!r}")
            continue
        name = arg.split("=", 1)[0]
        hint = trl_hint(name) or did_you_mean(name, options).replace("'", "")
        lines.append(f"unknown option {name}{hint}")
    return lines


_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS = re.compile(r"Problem with given class_path '([^']+)'")
_GROUP = re.compile(r"Group '([^']+)' does not accept option '([^']+)'")
_OPTION = re.compile(r"Option '([^']+)' is not accepted")
_LITERAL = re.compile(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*)")
_TYPE = re.compile(r"Expected a <class '(\w+)'>\. Got value: (.*)")
_IMPORT = re.compile(r"(module '[^']+' has no attribute '[^']+'|No module named '[^']+')")


def short_parse_error(message: str, keys: Sequence[str] = ()) -> tuple[str, list[str]]:
    """The problem (one line) and the lines under it, from jsonargparse's error ``message``.

    ``keys`` are the parser's option names (``trainer.max_steps``, ...), for a "did you mean"."""
    text = message.strip()
    unknown = re.search(r"unrecognized arguments: (.*)", text)
    if unknown:
        lines = _unrecognized(unknown.group(1), keys)
        return lines[0], lines[1:]
    choice = _CHOICE.search(text)
    if choice:
        value, valid = choice.group(1), [c.strip().strip("'\"") for c in choice.group(2).split(",")]
        return f"{value!r} is not a command{did_you_mean(value, valid)}", [f"commands: {', '.join(valid)}"]
    group = _GROUP.search(text)
    if group:  # a YAML key a section does not take
        section, name = group.group(1), group.group(2)
        valid = [
            k[len(section) + 1 :]
            for k in keys
            if k.startswith(section + ".") and "." not in k[len(section) + 1 :]
        ]
        hint = trl_hint(name) or did_you_mean(name, valid)
        return f"{section}.{name}: {section} has no option {name!r}{hint}", [
            f"valid options: {', '.join(valid)}"
        ] if valid else []
    outer = _KEY.search(text)
    where = f"--{outer.group(1)}" if outer else ""
    classes = _CLASS.findall(text)
    class_path = classes[-1] if classes else None
    after = text[text.rfind(class_path) :] if class_path else text  # the innermost report
    inner = _KEY.findall(after)
    option = _OPTION.search(after)
    if class_path and option:
        name, valid = option.group(1), class_options(class_path)
        hint = trl_hint(name) or did_you_mean(name, valid)
        return (
            f"{where}.init_args.{name}: {_short_class(class_path)} has no option {name!r}{hint}",
            [f"valid options: {', '.join(valid)}"] if valid else [],
        )
    key = f"{where}.init_args.{inner[-1]}" if class_path and inner else where
    literal = _LITERAL.search(after)
    if literal:
        choices = [c.strip().strip("'\"") for c in literal.group(1).split(",")]
        value = literal.group(2).strip()
        return f"{key}: {value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}", []
    wrong = [m for m in _TYPE.finditer(after) if not (class_path and m.group(1) == "str")]
    if wrong:
        return f"{key}: expected {wrong[-1].group(1)}, got {wrong[-1].group(2).strip()!r}", []
    missing = _IMPORT.search(after)
    if class_path and missing:
        return f"{where}: class path {class_path!r} cannot be imported ({missing.group(1)})", []
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    noise = (
        "Does not validate",
        "Subtypes:",
        "Errors:",
        "Given value type:",
        "Given value:",
        "- Expected a <class 'str'>",
    )
    kept = [line for line in lines if not line.startswith(noise)]
    return kept[0] if kept else text, kept[1:6]


def short_config_error(prog: str, error: BaseException) -> str:
    """A :class:`ConfigError` raised at set-up, as the command prints it (no traceback)."""
    return (
        f"{prog}: {error}\n"
        f"  (a configuration error, found before training; {TRACEBACK_ENV}=1 shows where it was raised)"
    )


def _parser_keys(parser: Any) -> list[str]:
    keys = []
    for action in getattr(parser, "_actions", []):
        for option in getattr(action, "option_strings", []):
            if option.startswith("--"):
                keys.append(option[2:])
    return keys


def _report(prog: str, problem: str, details: Sequence[str]) -> NoReturn:
    lines = [f"{prog}: {problem}", *(f"  {d}" for d in details)]
    lines.append(f"  (`{prog} --help` lists every option; {TRACEBACK_ENV}=1 shows the full report)")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.exit(2)


class ShortArgumentParser(argparse.ArgumentParser):
    """A plain argparse parser (the ``plan``, ``verify`` and ``export`` commands' own options) whose
    errors read as :class:`ShortErrorParser`'s: a "did you mean" for a mistyped option, exit status 2."""

    @override
    def error(self, message: str) -> NoReturn:
        if wants_traceback():
            super().error(message)
        problem, details = short_parse_error(message, _parser_keys(self))
        _report(self.prog, problem, details)


class ShortErrorParser(LightningArgumentParser):
    """The CLI's parser: errors as :func:`short_parse_error` writes them, on stderr, exit status 2.

    A mistyped option before the command (``--confg x.yaml fit``) makes argparse read its value as
    the command; the report names the option instead."""

    _given: Sequence[str] = ()

    @override
    def parse_args(self, args: Any = None, *more: Any, **kwargs: Any) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, *more, **kwargs)

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or wants_traceback():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        keys = _parser_keys(parser)
        problem, details = short_parse_error(message, keys)
        choice = _CHOICE.search(message)
        if choice and choice.group(1) in self._given:
            before = self._given[: self._given.index(choice.group(1))]
            unknown = [a for a in before if a.startswith("--") and a.split("=", 1)[0][2:] not in keys]
            if unknown:
                problem, details = short_parse_error(f"unrecognized arguments: {unknown[0]}", keys)
        prog = re.sub(
            r"^\S*(cli|__main__)\.py\b", "thundersync-lightning", parser.prog.replace(" [options]", "")
        )
        _report(prog, problem, details)
