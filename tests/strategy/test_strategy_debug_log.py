"""`log.debug` at the strategy's lifecycle points: a user traces a step from the logger alone."""

from __future__ import annotations

import logging

from ._fit import fit


def test_set_up_step_start_publish_and_barrier_are_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="thundersync_lightning.strategy"):
        fit("streaming", steps=1)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("thundersync_lightning.strategy")]
    for start in (
        "set-up: mode=streaming",
        "step 0 start",
        "publish: weights of version 0",
        "step 0 barrier",
    ):
        assert any(m.startswith(start) for m in messages), (start, messages)
    order = [
        next(i for i, m in enumerate(messages) if m.startswith(s))
        for s in ("set-up", "step 0 start", "step 0 barrier")
    ]
    assert order == sorted(order)
