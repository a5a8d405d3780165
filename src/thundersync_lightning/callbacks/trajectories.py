"""TrajectoryLogger: what the agent actually did, decoded, a few trajectories per step.

At each step (every ``every_n_steps``) rank 0 takes ``num_per_step`` of its trajectories (one per
group first, so several tasks show), decodes the prompt and every action and observation with the
task source's decoder, and

- appends one JSON line per trajectory to ``DIR/trajectories.jsonl`` (``DIR`` =
  ``trainer.default_root_dir``; a fit starting at step 0 replaces the file, a resumed one drops
  the lines of the steps it reruns (those after its checkpoint) and appends: every step once);
- logs them as a W&B table ``rollout/trajectories`` when a logger is a ``WandbLogger``.

``python -m thundersync_lightning.show DIR`` prints the last ones.

The decoder, first found wins: ``TrajectoryLogger(decode=...)``; the task source's
``decode(ids) -> str``; the tokenizer of its chat ``renderer`` (tool-calling and chat tasks); its
``codec.decode`` (the code tasks' byte codec or tokenizer); the tokenizer in its ``tokenizer_path``;
else the ids written as numbers. A tokenizer decodes with its special tokens kept, so the text shows
the template's markup, ``<think>`` blocks, ``<tool_call>`` calls, ``<tool_response>`` results and
whether an action ended its turn (``<|im_end|>``). Each JSON line holds::

    {"step", "trajectory_id", "group_id", "policy_version", "reward", "unscorable", "failure",
     "finish_reason", "num_turns", "truncated_actions", "prompt": str,
     "turns": [{"action": str, "observation": str}, ...],
     "prompt_ids": [int], "segments": [{"scored": bool, "ids": [int]}]}

Model text is data in every view: the JSON lines escape every control character and every non-ASCII
one (``json.dumps``), so a trajectory is one line whatever it holds; the terminal text of
:func:`format_trajectory` (``show``) and the W&B table write control characters as escapes
(:func:`printable`: C0 but newline and tab, DEL, C1 with ESC and CR, the Unicode line separators
and bidirectional controls) and put every line of model text behind a margin (:func:`framed`), so
that no completion can print a header, a turn marker or a terminal command of its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger
from typing_extensions import override

from ..envs.tokens import load_tokenizer
from ..strategy.stats import StepStats, TrajectoryRecord
from .base import StepStatsCallback

__all__ = [
    "TrajectoryLogger",
    "decoder_for",
    "decode_trajectory",
    "pick_trajectories",
    "read_trajectories",
    "format_trajectory",
    "printable",
    "framed",
    "table_row",
    "TABLE_COLUMNS",
]

log = logging.getLogger(__name__)

Decode = Callable[[Sequence[int]], str]
TABLE_COLUMNS = ["step", "trajectory_id", "reward", "failure", "finish_reason", "prompt", "transcript"]


def _tokenizer_text(tokenizer: Any) -> Decode:
    return lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=False))


def decoder_for(tasks: Any) -> Decode:
    """The task source's ``decode``, its renderer's tokenizer, its ``codec.decode``, the tokenizer in its
    ``tokenizer_path``, else ids as numbers (see the module docstring)."""
    own = getattr(tasks, "decode", None)
    if callable(own):
        return own
    tokenizer = getattr(getattr(tasks, "renderer", None), "tokenizer", None)
    if tokenizer is not None:
        return _tokenizer_text(tokenizer)
    codec = getattr(getattr(tasks, "codec", None), "decode", None)
    if callable(codec):
        return codec
    path = getattr(tasks, "tokenizer_path", None)
    if isinstance(path, str):
        return _tokenizer_text(load_tokenizer(path))
    return lambda ids: " ".join(str(int(i)) for i in ids)


def decode_trajectory(record: TrajectoryRecord, decode: Decode, step: int) -> dict[str, Any]:
    """One trajectory as plain JSON data: scored segments are actions, the others observations."""
    prompt = decode(record.prompt)
    turns: list[dict[str, str]] = []
    for seg in record.segments:
        text = decode(seg.tokens)
        if seg.scored:
            turns.append({"action": text, "observation": ""})
        elif turns:
            turns[-1]["observation"] += text
        else:  # unscored tokens before the first action belong to the prompt
            prompt += text
    return {
        "step": step,
        "trajectory_id": record.trajectory_id,
        "group_id": record.group_id,
        "policy_version": record.policy_version,
        "reward": record.reward,
        "unscorable": record.unscorable,
        "failure": record.failure,
        "finish_reason": record.finish_reason,
        "num_turns": record.num_turns,
        "truncated_actions": record.truncated_actions,
        "prompt": prompt,
        "turns": turns,
        "prompt_ids": list(record.prompt),
        "segments": [{"scored": s.scored, "ids": list(s.tokens)} for s in record.segments],
    }


def pick_trajectories(records: Sequence[TrajectoryRecord], n: int) -> list[TrajectoryRecord]:
    """``n`` records, round robin over groups (each group's trajectories in id order)."""
    groups: dict[str, list[TrajectoryRecord]] = {}
    for r in sorted(records, key=lambda r: (r.group_id, r.trajectory_id)):
        groups.setdefault(r.group_id, []).append(r)
    out: list[TrajectoryRecord] = []
    depth = 0
    while len(out) < n and any(len(g) > depth for g in groups.values()):
        out.extend(g[depth] for g in groups.values() if len(g) > depth)
        depth += 1
    return out[:n]


def read_trajectories(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line of a ``trajectories.jsonl`` (a run directory is accepted too)."""
    p = Path(path)
    if p.is_dir():
        p = p / "trajectories.jsonl"
    with open(p, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


#: control characters a view writes as escapes: C0 but tab and newline, DEL, C1 (ESC, CSI, ...), the
#: Unicode line and paragraph separators and the bidirectional embeddings, overrides and isolates
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
#: what starts every line of model text in a view
MARGIN = "    | "


def printable(text: object, newlines: bool = True) -> str:
    """``str(text)`` with every control character of :data:`_CONTROL` (and newlines, unless
    ``newlines``) written as ``\\xNN`` or ``\\uNNNN``: no ESC sequence, carriage return, bell or
    bidirectional override reaches a terminal."""
    out = _CONTROL.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", str(text)
    )
    return out if newlines else out.replace("\n", "\\n")


def framed(text: object) -> str:
    """:func:`printable` text with every line behind :data:`MARGIN`: no line of it can pass for a line
    of the view (a header, a turn marker)."""
    return "\n".join(MARGIN + line for line in printable(text).split("\n"))


def _transcript(entry: dict[str, Any]) -> str:
    lines = []
    for k, turn in enumerate(entry["turns"], 1):
        lines += [f"[action {k}]", framed(turn["action"])]
        if turn["observation"]:
            lines += [f"[observation {k}]", framed(turn["observation"])]
    return "\n".join(lines)


def format_trajectory(entry: dict[str, Any]) -> str:
    """A decoded trajectory as text for a terminal: a header line starting ``---``, then the prompt,
    each action and observation under its marker, model text escaped and framed (module docstring)."""
    reward = (
        "unscorable"
        if entry.get("unscorable")
        else "pending"
        if entry["reward"] is None
        else f"{entry['reward']:g}"
    )
    head = (
        f"--- step {entry['step']}  {printable(entry['trajectory_id'])}  reward {reward}  "
        f"finish {printable(entry['finish_reason'])}  turns {entry['num_turns']}"
    )
    if entry.get("truncated_actions"):
        head += (
            f"  truncated actions {entry['truncated_actions']} (the token budget ended them, not the model)"
        )
    if entry.get("failure"):
        head += f"\n[failure]\n{framed(entry['failure'])}"
    return f"{head}\n[prompt]\n{framed(entry['prompt'])}\n{_transcript(entry)}"


def table_row(entry: dict[str, Any]) -> list[Any]:
    """One row of the W&B table (:data:`TABLE_COLUMNS`), model text escaped and the transcript framed."""
    failure = None if entry["failure"] is None else printable(entry["failure"])
    return [entry["step"], printable(entry["trajectory_id"]), entry["reward"], failure,
            printable(entry["finish_reason"]), printable(entry["prompt"]), _transcript(entry)]  # fmt: skip


class TrajectoryLogger(StepStatsCallback):
    """Log decoded trajectories each step (see the module docstring).

    Args:
        num_per_step: trajectories per logged step (from rank 0's share of the step).
        every_n_steps: log every n-th step.
        filename: the JSONL file under ``trainer.default_root_dir``.
        decode: ids -> text; default: the task source's decoder (:func:`decoder_for`).
        wandb_table: also log a W&B table when a logger is a ``WandbLogger``.
    """

    def __init__(
        self,
        num_per_step: int = 4,
        every_n_steps: int = 1,
        filename: str = "trajectories.jsonl",
        decode: Decode | None = None,
        wandb_table: bool = True,
    ) -> None:
        if num_per_step < 1 or every_n_steps < 1:
            raise ValueError(
                f"num_per_step and every_n_steps must be >= 1, got {num_per_step}, {every_n_steps}"
            )
        self.num_per_step = num_per_step
        self.every_n_steps = every_n_steps
        self.filename = filename
        self.decode = decode
        self.wandb_table = wandb_table
        self._decode: Decode | None = None
        self._path: Path | None = None
        self._fresh = True
        super().__init__()

    @property
    def path(self) -> Path | None:
        """The JSONL file (set at set-up)."""
        return self._path

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._path = Path(trainer.default_root_dir) / self.filename
        self._decode = self.decode or decoder_for(getattr(trainer.datamodule, "tasks", None))
        self._fresh = True

    @override
    def on_step_stats(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats) -> None:
        if not trainer.is_global_zero or stats.step % self.every_n_steps:
            return
        entries = self.entries(stats)
        if self._fresh and stats.step > 0:
            self._drop_from(stats.step)  # a resume reruns the steps after its checkpoint
        self._append(entries, replace=self._fresh and stats.step == 0)
        self._fresh = False
        if self.wandb_table:
            rows = [table_row(e) for e in entries]
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    logger.log_table(
                        "rollout/trajectories", columns=TABLE_COLUMNS, data=rows, step=stats.step
                    )

    def entries(self, stats: StepStats) -> list[dict[str, Any]]:
        """The decoded trajectories this callback logs for ``stats``."""
        decode = self._decode or decoder_for(None)
        return [
            decode_trajectory(r, decode, stats.step)
            for r in pick_trajectories(stats.trajectories, self.num_per_step)
        ]

    def _drop_from(self, step: int) -> None:
        """Keep only the lines of steps before ``step`` (written by the fits this one resumes)."""
        assert self._path is not None
        if not self._path.is_file():
            return
        kept = [e for e in read_trajectories(self._path) if int(e.get("step", -1)) < step]
        self._path.write_text("".join(json.dumps(e) + "\n" for e in kept), encoding="utf-8")

    def _append(self, entries: list[dict[str, Any]], replace: bool) -> None:
        assert self._path is not None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._path, "w" if replace else "a", encoding="utf-8") as f:
            for e in entries:
                f.write(json.dumps(e) + "\n")
