"""InterruptCheckpoint: a fit that stops early leaves ``last.ckpt`` at the step it reached.

A periodic ``ModelCheckpoint(every_n_train_steps=50)`` loses up to 49 steps when the run is
stopped by Ctrl-C (``KeyboardInterrupt``, also ``kill -INT``), by an exception (an engine that
died, a failing reward) or when ``max_steps`` is not a multiple of 50. This callback writes the
checkpoint the periodic one has not written yet:

- on an interrupt or exception during training (Lightning's ``on_exception``, after
  :class:`RunSummary` has written ``summary.json``);
- at the end of a fit whose final step was not checkpointed.

It writes to the ``last.ckpt`` of the first ``ModelCheckpoint`` (its ``dirpath``; the same file the
README's ``--ckpt_path DIR/checkpoints/last.ckpt`` resumes from), or ``DIR/checkpoints/last.ckpt``
without one. Nothing is written when the fit has not started a training step since the last
checkpoint (a set-up error, an interrupt right after a periodic save): the file on disk already
holds that state.

Invariant that makes an interrupt checkpoint exact: between a step's first rollout and its barrier
the parameters and the optimizer state do not change
(:class:`~thundersync_lightning.core.snapshot.PolicySnapshot`), so a checkpoint taken mid-step holds the
weights of step ``global_step`` and the state after the step before it; the resumed fit reruns that step from
its start, with the same seeds.

SIGTERM (``kill PID``, a scheduler's stop, ``timeout``) ends a one-process fit the same way: the
handler raises Lightning's ``SIGTERMException`` (exit status 143) wherever the learner waits, the
checkpoint is written, the run stops. Lightning alone only notes the signal and stops after the
step, which never comes while a step waits on a stuck environment.

A step's bookkeeping is not cut in half: from the optimizer step to the end of the step's
``on_train_batch_end`` hooks (the monitors, ``summary.json``'s per-step record, ``trajectories.jsonl``,
the periodic checkpoint) a SIGINT or SIGTERM is held and raised right after them, so the checkpoint never
counts a step that the summary and the logs miss. This callback is a ``Checkpoint`` and runs after
the other callbacks; the hold applies in the main thread of a one-process fit.

With several processes an interrupt checkpoint is written only when every rank stops together
(a collective save would wait forever for a rank that is still training): a one-process fit always
gets it; a multi-process fit keeps its periodic ``last.ckpt`` and says so.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

__all__ = ["InterruptCheckpoint", "last_checkpoint_path"]

log = logging.getLogger(__name__)


def last_checkpoint_path(trainer: pl.Trainer) -> str:
    """Where the run's ``last.ckpt`` lives: the first ``ModelCheckpoint``'s directory,
    else ``DIR/checkpoints``."""
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath is not None:
            return os.path.join(str(cb.dirpath), cb.CHECKPOINT_NAME_LAST + cb.FILE_EXTENSION)
    return os.path.join(trainer.default_root_dir, "checkpoints", "last.ckpt")


class InterruptCheckpoint(Checkpoint):
    """See the module docstring.

    Args:
        on_exception: write on an interrupt or exception during training.
        on_train_end: write at the end of a fit whose final step no checkpoint holds.
    """

    def __init__(self, on_exception: bool = True, on_train_end: bool = True) -> None:
        super().__init__()
        self.save_on_exception = on_exception
        self.save_on_train_end = on_train_end
        self._saved_step: int | None = None  # global_step held by the newest checkpoint (None: not training)
        self.last_path: str | None = None  # the file written last by this callback
        self._held: Any = None  # the SIGINT handler replaced while a step's bookkeeping runs
        self._pending = False  # a SIGINT arrived meanwhile
        self._term_previous: Any = None  # the SIGTERM handler before ours (Lightning's), while fitting
        self._term_pending = False  # a SIGTERM arrived while held

    def _hold_interrupts(self) -> None:
        if self._held is not None or threading.current_thread() is not threading.main_thread():
            return
        self._pending = False
        self._held = signal.signal(signal.SIGINT, self._note_interrupt)

    def _note_interrupt(self, signum: int, frame: Any) -> None:
        self._pending = True

    def _release_interrupts(self, raise_pending: bool) -> None:
        if self._held is None:
            return
        signal.signal(signal.SIGINT, self._held)
        self._held = None
        if self._term_pending and raise_pending:
            self._term_pending = False
            raise SIGTERMException(128 + signal.SIGTERM)
        if self._pending and raise_pending:
            self._pending = False
            raise KeyboardInterrupt  # the step is recorded everywhere: stop now, as Ctrl-C asked

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if callable(self._term_previous):
            self._term_previous(signum, frame)  # Lightning's: notes it, stops a launcher's children
        if self._held is not None:
            self._term_pending = True  # a step's bookkeeping is running: stop right after it
            return
        raise SIGTERMException(128 + signum)

    def _watch_sigterm(self, trainer: pl.Trainer) -> None:
        if (
            self._term_previous is None
            and self.save_on_exception
            and trainer.world_size == 1
            and threading.current_thread() is threading.main_thread()
        ):
            self._term_previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _unwatch_sigterm(self) -> None:
        if self._term_previous is not None:
            signal.signal(signal.SIGTERM, self._term_previous)
            self._term_previous = None

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if self.save_on_exception and trainer.world_size == 1:
            self._hold_interrupts()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._release_interrupts(raise_pending=True)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release_interrupts(raise_pending=False)
        self._unwatch_sigterm()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the state at the start of the fit is either nothing (step 0) or the checkpoint it resumed from
        self._saved_step = trainer.global_step
        self._watch_sigterm(trainer)

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._saved_step = trainer.global_step  # any checkpoint (periodic or ours) holds this state now

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.save_on_train_end:
            self._save(trainer, "the fit ended")
        self._saved_step = None

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if not self.save_on_exception or self._saved_step is None or trainer.state.fn != TrainerFn.FITTING:
            return  # not training (an error at set-up): there is no new state to keep
        if trainer.world_size > 1:
            rank_zero_warn(
                f"{type(exception).__name__} with {trainer.world_size} processes: no interrupt checkpoint "
                "(the other ranks may still be training); resume from the periodic last.ckpt"
            )
            return
        try:
            self._save(trainer, f"stopped by {type(exception).__name__}")
        except Exception as err:  # noqa: BLE001 - never hide the exception that stopped the fit
            log.error("InterruptCheckpoint: could not write the checkpoint: %s: %s", type(err).__name__, err)
        self._saved_step = None

    def _save(self, trainer: pl.Trainer, why: str) -> None:
        step = trainer.global_step
        if self._saved_step is None or step == self._saved_step:
            return
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        self.last_path = path
        rank_zero_info(f"{why} at step {step}: saved {path} (resume with --ckpt_path {path})")
