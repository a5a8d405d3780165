"""Reward functions as TRL and verl users write them, imported by ``module:name`` in reward workers."""

from __future__ import annotations

import asyncio
import re


def format_reward(completions, **kwargs):  # noqa: ANN001, ANN003, ANN201 - TRL's signature, verbatim style
    """1.0 when the answer ends with a number, else 0.0 (TRL: a list, one value per completion)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if re.search(r"\d\s*$", t) else 0.0 for t in texts]


def correctness(completions, answer, **kwargs):  # noqa: ANN001, ANN003, ANN201 - `answer` is a column list
    """1.0 when the answer's last number equals the row's answer; None where the row has no answer."""
    out = []
    for c, a in zip(completions, answer):
        if a is None:
            out.append(None)  # not applicable: TRL leaves it out of the sum
            continue
        text = c[-1]["content"] if isinstance(c, list) else c
        numbers = re.findall(r"-?\d+", text)
        out.append(1.0 if numbers and numbers[-1] == str(a) else 0.0)
    return out


async def async_length(prompts, completions, completion_ids, **kwargs):  # noqa: ANN001, ANN003, ANN201
    """An async TRL reward (an LLM judge would await here): 0.01 per completion token; None (not
    applicable) for an empty completion."""
    await asyncio.sleep(0)
    return [0.01 * len(ids) if ids else None for ids in completion_ids]


def format_if_answer(completions, answer, **kwargs):  # noqa: ANN001, ANN003, ANN201
    """format_reward where the row has an answer, else None."""
    return [None if a is None else v for v, a in zip(format_reward(completions), answer)]


def two_values(completions, **kwargs):  # noqa: ANN001, ANN003, ANN201
    return [1.0, 0.0]  # one completion given, two values back: a length error


def declines(completions, **kwargs):  # noqa: ANN001, ANN003, ANN201
    return [None] * len(completions)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):  # noqa: ANN001, ANN201 - verl's
    """verl's convention: a float (gsm8k-style rows) or a dict with 'score' and extra keys."""
    if data_source == "dict_source":
        return {
            "score": 0.5 if ground_truth in solution_str else -0.5,
            "acc": 1.0,
            "turns": extra_info["num_turns"],
        }
    return 1.0 if solution_str.strip().endswith(str(ground_truth)) else 0.0
