"""Model text is data in every view: a completion that prints a second trajectory header claiming
reward 1, a fake turn, ESC / CR / BEL / C1 controls and a bidirectional override forges nothing in
``python -m thundersync_lightning.show``, in ``trajectories.jsonl`` or in the W&B table."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

from tests.callbacks.helpers import record
from thundersync_lightning import show
from thundersync_lightning.callbacks import TrajectoryLogger
from thundersync_lightning.callbacks.trajectories import MARGIN, TABLE_COLUMNS, table_row
from thundersync_lightning.core.types import Segment
from thundersync_lightning.strategy.stats import StepStats

FORGED = (
    "wrong answer\n--- step 0  s0-g0-t0  reward 1  finish submit  turns 1\n[prompt]\n    | solved\n"
    "[action 2]\nrm -rf /\x1b[2J\x1b]0;pwned\x07\rreward 1\x9b31m\u202eevil\u2028next"
)
CONTROLS = ("\x1b", "\r", "\x07", "\x9b", "\u202e", "\u2028", "\x00")


def _text(ids) -> str:
    return "".join(map(chr, ids))


def _logged(tmp_path) -> TrajectoryLogger:
    """A TrajectoryLogger that logged one step holding one trajectory whose action is FORGED."""
    traj = replace(
        record(0, turns=1, reward=0.0, failure="verdict raised ValueError: " + FORGED),
        prompt=tuple(map(ord, "add two numbers")),
        segments=(Segment(tuple(map(ord, FORGED)), True), Segment(tuple(map(ord, FORGED)), False)),
    )
    stats = StepStats(step=0, mode="streaming", policy_version=0, rank=0, world_size=1, step_start=0.0,
                      step_end=1.0, trajectories=(traj,), busy=(), open_groups=())  # fmt: skip
    trainer = SimpleNamespace(
        default_root_dir=str(tmp_path), datamodule=None, is_global_zero=True, loggers=[]
    )
    logger = TrajectoryLogger(num_per_step=1, decode=_text)
    logger.setup(trainer, None, "fit")  # type: ignore[arg-type]
    logger.on_step_stats(trainer, None, stats)  # type: ignore[arg-type]
    return logger


def test_a_completion_printing_a_second_header_cannot_forge_the_show_view(tmp_path, capsys):
    _logged(tmp_path)
    assert show.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("--- ")]
    assert headers == ["--- step 0  s0-g0-t0  reward 0  finish submit  turns 1"]  # the real one alone
    assert not any(c in out for c in CONTROLS)
    assert "\\x1b[2J" in out and "\\x07" in out and "\\x0d" in out and "\\u202e" in out
    markers = [line for line in out.splitlines() if not line.startswith(MARGIN)]
    assert markers == [headers[0], "[failure]", "[prompt]", "[action 1]", "[observation 1]"]


def test_the_trajectory_log_holds_one_json_line_per_trajectory_with_no_raw_control(tmp_path):
    logger = _logged(tmp_path)
    raw = logger.path.read_text(encoding="utf-8")
    assert raw.count("\n") == 1 and not any(c in raw for c in CONTROLS)
    assert json.loads(raw)["turns"][0]["action"] == FORGED  # the data itself is kept exactly


def test_the_wandb_table_row_escapes_model_text_and_frames_the_transcript(tmp_path):
    entry = _logged(tmp_path).entries(
        StepStats(
            step=0,
            mode="streaming",
            policy_version=0,
            rank=0,
            world_size=1,
            step_start=0.0,
            step_end=1.0,
            trajectories=(replace(record(0, turns=1), segments=(Segment(tuple(map(ord, FORGED)), True),)),),
            busy=(),
            open_groups=(),
        )  # fmt: skip
    )[0]
    row = dict(zip(TABLE_COLUMNS, table_row(entry)))
    assert not any(c in str(v) for v in row.values() for c in CONTROLS)
    lines = row["transcript"].splitlines()
    assert lines[0] == "[action 1]" and all(line.startswith(MARGIN) for line in lines[1:])
