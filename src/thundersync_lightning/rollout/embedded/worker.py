"""The embedded engine's generation process (the learner never imports this at run time).

Commands arrive in order on one queue, read by a command thread:

    ("prepare", request)                  start the request's environments now (handled by the
                                          command thread itself, see below)
    ("publish", version, SharedWeights)   copy the snapshot into the local model (arrives
                                          pickled by the learner: ("pickled", bytes))
    ("rollout", request_id, request, issued_at)   run the agent loop for the request
    ("shutdown",)

Publish, rollout and shutdown are passed on, in order, to the main thread, which handles them one
at a time; so a publish issued after ``rollout(r1)`` is applied only after r1's generation has
finished: r1 is generated entirely with the weights current when it was issued. A prepare does not
wait in that line: the learner sends step k+1's prepare while step k generates (the main thread is
inside ``loop.run``), and the point is to build k+1's environments meanwhile, so the command thread
submits them to the environment pool at once (:meth:`AgentLoop.prepare`, which returns at once and
touches no weights). Prepared environments nobody ran are closed at shutdown; those of a process
that dies are lost with it, and a replayed request creates its environments itself. Environment calls and
verdicts run in a thread pool; verdicts of r1 keep running (and emitting) while r2 generates.

Messages sent back over the event pipe (by one sender thread, so neither generation nor a
verdict ever blocks on a full pipe): ``("ready", pid)``, ``("event", request_id, event)``,
``("applied", version)``, ``("fatal", text)`` (then the process exits). Messages queued while the
previous one was being sent go as one ``("batch", [message, ...])``, in order (:func:`take_batch`),
so that a burst of events (a decoding step that finishes many trajectories) wakes the learner's
event thread once, not once per event: that thread takes the learner's GIL for every message it
reads. The process dies with the learner
(:func:`~thundersync_lightning.rollout.lifeline.die_with_parent`). Event times are this process's
``time.monotonic()``; the learner runs on the same host, so it is the learner's clock too
(CLOCK_MONOTONIC is system-wide on Linux).
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import traceback
from typing import Any

import torch

from ...core.protocols import TaskSource
from ...core.types import ModelSpec
from ..agent.env_pool import EnvPool
from ..agent.loop import AgentLoop
from ..hf_model import build_model
from ..lifeline import die_with_parent
from ..teacher import TeacherScorer
from ..weights.shared_memory import SharedWeights
from .generator import HFGenerator

__all__ = ["worker_main", "load_snapshot", "take_batch"]

_PARENT_POLL_S = 1.0
_FLUSH_S = 2.0
_CLOSE_PREPARED_S = 3.0  # within the learner's 5 s wait for a shut-down process (GenerationProcess.stop)


class _Sender:
    """Sends messages over the event pipe from one thread; ``put`` never blocks (thread-safe)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="thundersync-event-sender", daemon=True)
        self._thread.start()

    def put(self, msg: Any) -> None:
        self._queue.put(msg)

    def _run(self) -> None:
        while True:
            batch, stop = take_batch(self._queue)
            try:
                if batch:
                    self._conn.send(batch[0] if len(batch) == 1 else ("batch", batch))
            except (OSError, ValueError):  # the learner is gone or closed its end
                return
            if stop:
                return

    def flush(self) -> None:
        """Send everything queued so far (bounded wait), then stop."""
        self._queue.put(None)
        self._thread.join(timeout=_FLUSH_S)


def take_batch(messages: queue.SimpleQueue[Any]) -> tuple[list[Any], bool]:
    """The next message (waiting for it) and every one queued behind it, in order, up to the stop
    sentinel ``None``; and whether the sentinel came (the messages before it are still sent)."""
    batch: list[Any] = []
    msg = messages.get()
    while msg is not None:
        batch.append(msg)
        try:
            msg = messages.get_nowait()
        except queue.Empty:
            return batch, False
    return batch, True


def load_snapshot(model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` (HF ``state_dict`` names) into ``model``; every parameter must be covered.

    A tied output head (``tie_word_embeddings``) may be omitted: it shares the embedding.
    """
    expected = model.state_dict()
    unexpected = sorted(set(weights) - set(expected))
    missing = sorted(set(expected) - set(weights))
    if getattr(model.config, "tie_word_embeddings", False):
        missing = [n for n in missing if not n.endswith("lm_head.weight")]
    problems = []
    if unexpected:
        problems.append(f"unexpected names {unexpected[:5]}")
    if missing:
        problems.append(f"missing names {missing[:5]}")
    for name, tensor in weights.items():
        if name in expected and tuple(expected[name].shape) != tuple(tensor.shape):
            problems.append(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(expected[name].shape)}")
    if problems:
        raise ValueError(
            "published weights do not match the engine's ModelSpec architecture: "
            + "; ".join(problems)
            + ". Publish the policy's full Hugging Face state_dict() and give the engine the same ModelSpec."
        )
    model.load_state_dict(weights, strict=False)


def _read_commands(commands: Any, inbox: queue.SimpleQueue[Any], loop: AgentLoop) -> None:
    """Handle ``prepare`` at once; pass every other command on to the main thread, in order."""
    try:
        while True:
            try:
                cmd = commands.get(timeout=_PARENT_POLL_S)
            except queue.Empty:
                continue
            if cmd[0] == "prepare":
                loop.prepare(cmd[1])
                continue
            inbox.put(cmd)
            if cmd[0] == "shutdown":
                return
    except BaseException:  # the main thread reports it (as it would its own failure) and exits
        inbox.put(("unreadable", traceback.format_exc()))


def worker_main(
    spec: ModelSpec,
    tasks: TaskSource,
    cfg: Any,
    commands: Any,
    events_conn: Any,
    parent_pid: int,
    environ: dict[str, str],
) -> None:
    """Entry point of the generation process. ``cfg`` is an ``EmbeddedEngineConfig``; ``environ``
    the learner's ``os.environ`` when it started the process."""
    learner_alive = die_with_parent(parent_pid)
    os.environ.clear()  # the learner's environment now, whatever the fork server started with
    os.environ.update(environ)
    events = _Sender(events_conn)
    pool: EnvPool | None = None
    loop: AgentLoop | None = None
    try:
        torch.set_num_threads(cfg.num_threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        model = build_model(spec, cfg.device)
        generate = HFGenerator(
            model, temperature=cfg.temperature, top_p=cfg.top_p, max_batch_size=cfg.max_batch_size
        )
        teacher = (
            None
            if cfg.teacher is None
            else TeacherScorer.from_config(cfg.teacher, cfg.temperature, cfg.device)
        )
        pool = EnvPool(cfg.env_workers, name="thundersync-env")
        loop = AgentLoop(
            tasks,
            generate,
            pool,
            step_timeout_s=cfg.step_timeout_s,
            verdict_timeout_s=cfg.verdict_timeout_s,
            max_batch_size=cfg.max_batch_size,
            max_context_tokens=cfg.max_context_tokens,
            annotate=teacher,
        )
        version: int | None = None
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        reader = threading.Thread(
            target=_read_commands, args=(commands, inbox, loop), name="thundersync-commands", daemon=True
        )
        reader.start()
        events.put(("ready", os.getpid()))
        while True:
            try:
                cmd = inbox.get(timeout=_PARENT_POLL_S)
            except queue.Empty:
                if not learner_alive():  # the learner died without shutting us down
                    break
                continue
            if cmd[0] == "unreadable":
                raise RuntimeError(f"reading the engine's commands failed:\n{cmd[1]}")
            if cmd[0] == "pickled":  # pickled by the learner (a publish; see GenerationProcess)
                cmd = pickle.loads(cmd[1])
            kind = cmd[0]
            if kind == "shutdown":
                break
            if kind == "publish":
                _, new_version, packed = cmd
                assert isinstance(packed, SharedWeights)
                load_snapshot(model, packed.unpack())
                del packed, cmd
                version = new_version
                events.put(("applied", version))
            elif kind == "rollout":
                _, request_id, request, issued_at = cmd
                if version is None:
                    raise RuntimeError("rollout before any publish reached the engine process")

                def emit(event: Any, _rid: int = request_id) -> None:
                    events.put(("event", _rid, event))

                loop.run(request, version, emit, submitted_at=issued_at)
            else:
                raise RuntimeError(f"unknown engine command {kind!r}")
    except BaseException:
        events.put(("fatal", traceback.format_exc()))
    finally:
        if loop is not None:  # no prepared sandbox may outlive the process
            loop.close_prepared(_CLOSE_PREPARED_S)
        events.flush()
        if pool is not None:
            pool.shutdown()
        os._exit(0)  # hung environment threads must not keep the process alive
