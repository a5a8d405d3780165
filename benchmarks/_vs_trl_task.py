"""The task :mod:`vs_trl` gives both trainers: prompts, the reward in each trainer's signature, the
tool, and the per-step probe's CPU count. Imported by both virtual environments (the project's and
TRL's) and by the project's reward and tool workers, so it imports neither torch nor either trainer.

Single-turn task: 64 chat prompts; the reward of a completion is its vowel share (vowels over
characters, 0 for an empty text), a signal a random tiny model climbs from ~0.25 within tens of steps.

Tool task: the same prompts ask to look a word up; the policy may call ``lookup(word)`` (the
tool returns the word's vowels) before it answers; the reward is the vowel share of the final
answer, plus 0.5 when the episode called the tool at least once (a reward a format-pretrained
start reaches by calling more).
"""

from __future__ import annotations

import os
from typing import Any

VOWELS = frozenset("aeiouAEIOU")

TOPICS = (
    "apple",
    "river",
    "cloud",
    "stone",
    "tiger",
    "piano",
    "ocean",
    "forest",
    "candle",
    "mirror",
    "garden",
    "winter",
    "rocket",
    "violin",
    "island",
    "desert",
    "bridge",
    "castle",
    "pencil",
    "window",
    "market",
    "saddle",
    "tunnel",
    "meadow",
    "harbor",
    "lantern",
    "canyon",
    "feather",
    "marble",
    "orchard",
    "thunder",
    "glacier",
    "compass",
    "ribbon",
    "temple",
    "basket",
    "falcon",
    "anchor",
    "blanket",
    "cactus",
    "dolphin",
    "engine",
    "fossil",
    "goblet",
    "helmet",
    "igloo",
    "jacket",
    "kettle",
    "ladder",
    "magnet",
    "needle",
    "oyster",
    "parrot",
    "quartz",
    "raven",
    "silver",
    "trumpet",
    "umbrella",
    "valley",
    "walnut",
    "yogurt",
    "zephyr",
    "acorn",
    "beacon",
)
assert len(TOPICS) == 64


def prompts(task: str) -> list[str]:
    """The 64 user messages of ``task`` ("single" or "tool")."""
    if task == "single":
        return [f"Say something about the {t}." for t in TOPICS]
    return [f"Look up the word {t} and answer with it." for t in TOPICS]


def share(text: str) -> float:
    """Vowels over characters of ``text`` (0.0 for an empty text)."""
    return sum(c in VOWELS for c in text) / len(text) if text else 0.0


# --- the project's reward signature: (prompt, completion, **row) -> float ----------------------------------


def vowel_share(prompt: Any, completion: str, **row: Any) -> float:
    return share(completion)


def lookup(word: str) -> str:
    """Look a word up: its vowels, in order.

    Args:
        word: the word to look up.
    """
    return "".join(c for c in str(word) if c in VOWELS) or "none"


# --- TRL's reward signature: (completions, **kwargs) -> list[float] -----------------------------------------


def _text(completion: Any) -> str:
    """A TRL completion: a string (plain prompts) or the list of messages after the prompt."""
    if isinstance(completion, str):
        return completion
    answers = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
    return answers[-1] if answers else ""


def trl_vowel_share(completions: list[Any], **kwargs: Any) -> list[float]:
    return [share(_text(c)) for c in completions]


def trl_tool_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """The tool task's reward in TRL's signature:
    vowel share of the last answer + 0.5 if a tool was called."""
    out = []
    for c in completions:
        called = not isinstance(c, str) and any(m.get("role") == "tool" or m.get("tool_calls") for m in c)
        out.append(share(_text(c)) + (0.5 if called else 0.0))
    return out


def tool_reward(prompt: Any, completion: str, **row: Any) -> float:
    """The tool task's reward in the project's signature (``completion``: the final answer's text;
    ``row["tool_calls"]`` is not given, so the call bonus is read from the transcript by the caller)."""
    return share(completion)


# --- the per-step probe ------------------------------------------------------------------------------------


def tree_cpu_seconds(pid: int | None = None) -> dict[str, float]:
    """User + system CPU seconds of a process and every descendant, the exited ones included:
    ``total``, and its split into ``main`` (the process itself), ``workers`` (tool and reward worker
    processes, by their command line) and ``other`` (every other descendant: the project's generation
    process and its fork server).

    A live process's ``children_user``/``children_system`` hold the CPU of descendants it has reaped
    (and theirs), which are no longer in the tree: summing both over the live tree counts each
    process once (a descendant exited but not yet reaped is missed until it is; an exited worker
    counts under its parent)."""
    import psutil

    root = psutil.Process(pid or os.getpid())
    split = {"main": 0.0, "workers": 0.0, "other": 0.0}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            kind = (
                "main"
                if p.pid == root.pid
                else "workers"
                if "worker_main" in " ".join(p.cmdline())
                else "other"
            )
        except psutil.Error:  # it exited between the listing and the read
            continue
        split[kind] += t.user + t.system + t.children_user + t.children_system
    return {"total": sum(split.values()), **split}
