"""How a reward function is called, recognised by its parameters: TRL's, verl's, or one trajectory's.

A user's reward runs unchanged. Its parameter names say which convention it follows (first match):

=======  =================================================  ==============================================
name     recognised by a parameter named                    called as
=======  =================================================  ==============================================
``trl``  ``completions`` or ``prompts``                     TRL 1.16's ``GRPOTrainer._calculate_rewards``:
                                                            ``f(prompts=[p], completions=[c],
                                                            completion_ids=[ids], **{column: [value]})``
                                                            -> ``[float | None]`` (a list of one)
``verl`` ``solution_str``                                   verl's reward manager:
                                                            ``compute_score(data_source=, solution_str=,
                                                            ground_truth=, extra_info=)`` -> a number or
                                                            ``{"score": ..., ...}``
``row``  (anything else)                                    ``reward(prompt, completion, **row)`` -> float
=======  =================================================  ==============================================

TRL (``trl``). ``prompts``: the row's prompt as given (a string, or TRL's list of messages).
``completions``: for a string prompt the answer's text; for a conversational prompt the messages
after the prompt, the answer last (single-turn: ``[{"role": "assistant", "content": text}]``, as
TRL; a tool episode's assistant and ``tool`` messages as TRL's tool loop appends them).
``completion_ids``: the episode's tokens after the prompt (actions and observations). Every
column but ``prompt``, ``completion`` and ``completion_ids`` as a keyword list (TRL's
``reward_kwargs``). Not passed: ``trainer_state``, ``log_extra``, ``log_metric`` and
``environments`` (a reward that names one is refused at set-up, naming it). One call per
trajectory, as soon as its episode ends (lists of one): a trajectory whose reward is pending holds
its gradient, so a call per group would make each trajectory wait for its group's slowest member
(``benchmarks/reward_batching.py`` measures the cost of a call). A reward that compares the
completions of a batch with each other (e.g. a diversity bonus) sees one completion at a time
here. ``async def`` rewards are awaited (in their worker process).

verl (``verl``). As verl's data prep writes a row and its reward manager reads it:
``data_source`` <- the ``data_source`` column; ``ground_truth`` <- ``reward_model["ground_truth"]``,
else a ``ground_truth`` column, else an ``answer`` column; ``extra_info`` <- the ``extra_info``
column (a dict; ``{}`` where absent) with ``num_turns`` added, as verl adds it; ``solution_str`` <-
the answer's text (verl decodes its whole response; for one turn that is the same text). A dict
result's ``score`` is the reward (its other keys are not logged).

Values. A finite real number is the reward; ``None`` declines the completion (TRL's "not
applicable": left out of the weighted sum; a completion every reward declines is unscorable);
anything else (``nan``, a string, ``True``, a list of the wrong length) is a :class:`RewardError`.

Columns. Every column reaches the reward (``fields`` only renames). A parameter without a default
that is neither the convention's own nor a column is a set-up error naming it and the columns;
a function without ``**kwargs`` receives only the columns it names.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ThunderSyncError

__all__ = ["RewardError", "RewardInput", "RewardConvention", "CONVENTIONS", "convention_of", "finite_or_none"]


class RewardError(ThunderSyncError):
    """A reward function raised or returned a value that is neither a finite number nor None."""


@dataclass(frozen=True, slots=True)
class RewardInput:
    """One trajectory as the rewards see it.

    ``prompt``: the row's prompt as given; ``completion``: the graded answer's text; ``row``: every
    column (``fields`` renames applied), the prompt included; ``messages``: for a conversational
    prompt, the messages after it, the answer last; ``completion_ids``: the tokens after the
    prompt; ``num_turns``: the policy's turns."""

    prompt: Any
    completion: str
    row: Mapping[str, Any] = field(default_factory=dict)
    messages: tuple[Mapping[str, Any], ...] = ()
    completion_ids: tuple[int, ...] = ()
    num_turns: int = 1

    @property
    def conversational(self) -> bool:
        """TRL's ``is_conversational``: the prompt is a list of messages."""
        return isinstance(self.prompt, list)

    @property
    def completion_messages(self) -> list[dict[str, Any]]:
        """``messages``, or the answer as one assistant message where none were given."""
        return [dict(m) for m in self.messages] or [{"role": "assistant", "content": self.completion}]


def finite_or_none(value: Any, who: str) -> float | None:
    """``value`` as a float, None for None; RewardError naming ``who`` for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise RewardError(
            f"{who} returned {_short(value)}: expected a finite number (or None: not applicable)"
        )
    return float(value)


@dataclass(frozen=True)
class RewardConvention:
    """One way of calling a reward. ``recognise``: the parameter names select it; ``own``: the
    parameters it fills itself; ``arguments``: (positional, keyword) for one trajectory, columns
    excluded; the columns but ``skip_columns`` go as keywords (``passes_columns``: all of them where
    the function takes ``**kwargs``; else only those it names), ``as_list``: as TRL's keyword lists;
    ``value``: the returned value read as one reward."""

    name: str
    recognise: Callable[[frozenset[str]], bool]
    own: frozenset[str]
    arguments: Callable[[RewardInput], tuple[tuple[Any, ...], dict[str, Any]]]
    value: Callable[[Any, str], float | None]
    skip_columns: frozenset[str] = frozenset({"prompt", "completion"})
    passes_columns: bool = True
    as_list: bool = False
    positional: int = 0  # leading positional parameters it fills, whatever their names
    refused: Mapping[str, str] = field(default_factory=dict)  # parameter -> why it is not passed

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _by_name, (self.name,)  # pickled by name: a task source travels to the engine's process

    def call(
        self, inp: RewardInput, params: Mapping[str, inspect.Parameter] | None, fixed: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Arguments of one call: the convention's, then the columns, then the fixed keywords
        (``params`` None: the signature is unknown, every column goes)."""
        positional, keywords = self.arguments(inp)
        takes_all = params is None or any(p.kind is p.VAR_KEYWORD for p in params.values())
        for name, value in inp.row.items():
            if name in self.skip_columns or name in keywords:
                continue
            if (takes_all and self.passes_columns) or (params is not None and name in params):
                keywords[name] = [value] if self.as_list else value
        keywords.update(fixed)
        if params is not None:
            ordered = [
                p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            taken = set(ordered[: len(positional)])  # filled by position: a same-named column would clash
            keywords = {k: v for k, v in keywords.items() if k not in taken and (takes_all or k in params)}
        return positional, keywords

    def problems(
        self,
        label: str,
        params: Mapping[str, inspect.Parameter],
        columns: Sequence[str],
        fixed: Mapping[str, Any],
        origin: str,
    ) -> list[str]:
        """Each parameter this convention cannot fill from ``columns`` (see the module docstring)."""
        out = []
        filled = set(self.own) | set(columns) | set(fixed)
        ordered = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        filled |= {p.name for p in ordered[: self.positional]}
        for p in params.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in filled:
                continue
            if p.name in self.refused:
                out.append(
                    f"reward {label!r} ({self.name} convention) names {p.name!r}: {self.refused[p.name]}"
                )
            elif p.default is p.empty:
                out.append(
                    f"reward {label!r} ({self.name} convention) reads column {p.name!r}, which {origin} does "
                    f"not have (columns: {', '.join(columns)}); add the column or map one to it with "
                    f"fields: {{{p.name}: <column>}}"
                )
        if len(ordered) < self.positional and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            out.append(
                f"reward {label!r}{inspect.Signature(list(params.values()))} takes fewer than the "
                f"{self.positional} positional arguments of the {self.name} convention "
                "(reward(prompt, completion, **row))"
            )
        return out


# ------------------------------------------------------------------ TRL
def _trl_arguments(inp: RewardInput) -> tuple[tuple[Any, ...], dict[str, Any]]:
    completion = inp.completion_messages if inp.conversational else inp.completion
    return (), {
        "prompts": [inp.prompt],
        "completions": [completion],
        "completion_ids": [list(inp.completion_ids)],
    }


def _trl_value(value: Any, who: str) -> float | None:
    if not isinstance(value, list | tuple):
        raise RewardError(
            f"{who} returned {_short(value)}: a TRL reward returns a list (one value per completion)"
        )
    if len(value) != 1:
        raise RewardError(
            f"{who} returned {len(value)} values for 1 completion: a TRL reward returns one value "
            "per completion it is given"
        )
    return finite_or_none(value[0], who)


_NOT_PASSED = (
    "is TRL's and is not passed here (rewards run per trajectory in a worker process); read it "
    "from **kwargs with a default, or drop it"
)
TRL = RewardConvention(
    "trl",
    lambda names: bool(names & {"completions", "prompts"}),
    frozenset({"prompts", "completions", "completion_ids"}),
    _trl_arguments,
    _trl_value,
    skip_columns=frozenset({"prompt", "completion", "completion_ids"}),
    as_list=True,
    refused={k: _NOT_PASSED for k in ("trainer_state", "log_extra", "log_metric", "environments")},
)


# ------------------------------------------------------------------ verl
def ground_truth_of(row: Mapping[str, Any]) -> Any:
    """``reward_model["ground_truth"]`` (verl's data prep), else ``ground_truth``, else ``answer``."""
    model = row.get("reward_model")
    if isinstance(model, Mapping) and "ground_truth" in model:
        return model["ground_truth"]
    return row.get("ground_truth", row.get("answer"))


def _verl_arguments(inp: RewardInput) -> tuple[tuple[Any, ...], dict[str, Any]]:
    extra = inp.row.get("extra_info")
    extra_info = {**(dict(extra) if isinstance(extra, Mapping) else {}), "num_turns": inp.num_turns}
    return (), {
        "data_source": inp.row.get("data_source"),
        "solution_str": inp.completion,
        "ground_truth": ground_truth_of(inp.row),
        "extra_info": extra_info,
    }


def _verl_value(value: Any, who: str) -> float | None:
    if isinstance(value, Mapping):
        if "score" not in value:
            raise RewardError(f"{who} returned a dict without 'score' (keys: {', '.join(map(str, value))})")
        value = value["score"]
    return finite_or_none(value, who)


VERL = RewardConvention(
    "verl",
    lambda names: "solution_str" in names,
    frozenset({"data_source", "solution_str", "ground_truth", "extra_info"}),
    _verl_arguments,
    _verl_value,
    passes_columns=False,
)


# ------------------------------------------------------------------ one trajectory
ROW = RewardConvention(
    "row",
    lambda names: True,
    frozenset(),
    lambda inp: ((inp.prompt, inp.completion), {}),
    lambda value, who: finite_or_none(value, who),
    positional=2,
)

CONVENTIONS: tuple[RewardConvention, ...] = (TRL, VERL, ROW)  # first match wins; ROW matches anything


def _by_name(name: str) -> RewardConvention:
    return next(c for c in CONVENTIONS if c.name == name)


def convention_of(params: Mapping[str, inspect.Parameter] | None) -> RewardConvention:
    """The first convention whose ``recognise`` accepts the parameter names (unknown: ``row``)."""
    if params is None:
        return ROW
    names = frozenset(params)
    return next(c for c in CONVENTIONS if c.recognise(names))


def _short(value: Any, limit: int = 120) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a hostile __repr__
        text = f"<unrepresentable: {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
