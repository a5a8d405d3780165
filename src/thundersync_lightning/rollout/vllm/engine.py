"""A :class:`RolloutEngine` backed by vLLM, with in-place weight sync after every optimizer step.

Generation: token-id prompts only (``skip_tokenizer_init``; no tokenizer round trip), one vLLM
request per trajectory turn (``n=1``) seeded with ``turn_seed(derive_seed(seed, step, group,
sample), turn)``. One request per sample rather than ``n=G`` because (a) agent episodes diverge
after their first action, so later turns are per-sample requests anyway; (b) vLLM seeds the k-th
of ``n`` samples with ``seed + k``, which would couple neighbouring groups' seeds; (c) the group
still shares its prompt's KV blocks through prefix caching. Sampled tokens come with
``logprobs_mode="processed_logprobs"``: log_softmax(z / T) of the distribution actually sampled,
the quantity the learner recomputes with the same temperature. ``generation_config="vllm"`` keeps
a checkpoint's own sampling defaults (top-k/top-p) out.

On-policy distillation (``teacher``): a second vLLM engine, on its own step loop, scores every
finished episode with prompt logprobs at the sampling temperature before its ContentReady
(``Segment.teacher_logprobs``, the embedded engine's layout); see :mod:`.teacher`. The
teacher's vocabulary is checked before vLLM starts.

Episodes run in the engine-agnostic :class:`~thundersync_lightning.rollout.agent.loop.AgentLoop`
(environment calls in a thread pool, concurrent with generation); a single step-loop thread owns
the ``LLM`` and batches the turns of every episode in flight (:mod:`.loop`). Events reach the
caller in completion order through a queue.

Preparing ahead (``prepare``, :class:`~thundersync_lightning.core.protocols.PreparesAhead`): one
:class:`AgentLoop` serves every request and starts a prepared request's environments in the
environment pool at once, while earlier requests generate; its rollout picks them up.

Weight sync (``publish``): names and shapes are checked first (nothing changes on error); the
publish then waits until every earlier request has finished generating (so a publish issued after
``rollout(r1)`` applies to ``r2`` only), reloads in place through the worker extension
(:mod:`.worker`), resets the prefix cache, and only then tags the new version. A reload that
fails half-way marks the engine broken: ``rollout`` refuses until a complete publish succeeds.
Transports (``weight_sync``, "auto" resolved by :func:`~.placement.resolve_weight_sync`):
"direct" and "file" hand over the whole state dict; "ipc" and "nccl" stream it in buckets
(:mod:`..weights.transport`): the workers receive on the step loop while the publishing thread
sends, and a failure on either side fails the publish on both and drops the transfer group (the
next publish forms a new one).

Faults: with ``multiprocessing=False`` vLLM lives and dies with the learner process. With worker
processes, an engine core that dies (killed, OOM) is restarted up to ``max_engine_restarts`` times,
with the latest published weights loaded again and the generation calls it left unfinished run
again, exactly (:mod:`.core`): the episodes go on where they were, events already delivered
stay delivered, and the environments never notice. Past the budget every waiting rollout raises
:class:`EngineError` (the step does not complete) and later calls fail at once. No wait is
unbounded (``event_timeout_s`` bounds the rollout iterator and a publish waiting for earlier
requests). The environments of episodes cut short are closed. The engine core (the teacher's
too) exits within a second when the learner is killed, SIGKILL included: its workers are tied to
the learner's life (:meth:`~.worker.WeightSyncExtension.thundersync_die_with`). A teacher's
engine core is not restarted.

Placement: with worker processes and one GPU per engine, the engine runs on the learner rank's
own GPU (``torch.cuda.current_device()``, passed as vLLM's ``device_ids``) unless
``engine_kwargs.device_ids`` says otherwise (:func:`colocated_device_ids`); several engines per
rank: :mod:`.pool`.

.. warning::
    With ``multiprocessing=False`` (the CPU default) vLLM runs inside the learner's process: it
    sets the process-wide torch thread count and memory binding, and vLLM caches that choice for
    the process (every engine in a process must use the same setting). In-process engines (a
    policy and its teacher, or several engines) run one forward at a time (:mod:`.loop`), and
    vLLM's process groups are dropped when the last of them shuts down.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...core.errors import EngineError
from ...core.protocols import TaskSource
from ...core.types import ModelSpec, RolloutEvent, RolloutRequest
from ..agent.env_pool import EnvPool
from ..agent.issue_order import IssueOrder
from ..agent.loop import AgentLoop, GenerationRequest
from ..teacher import TeacherConfig, check_teacher
from .core import RestartingCore
from .loop import IN_PROCESS_LOCK, StepLoop, close_llm, open_llm, read_generation
from .model import ModelLayout, check_weights, materialize_model
from .placement import (
    colocated_device_ids,
    learner_cuda_device,
    resolve_weight_sync,
    vllm_accepts_device_ids,
)
from .teacher import VLLMTeacher
from .worker import WORKER_EXTENSION, save_weights_file

if TYPE_CHECKING:  # annotations only: the config builds this engine
    from .config import VLLMEngineConfig

__all__ = ["VLLMEngine", "colocated_device_ids"]  # placement: .placement

log = logging.getLogger(__name__)


class VLLMEngine:
    """Rollout engine over a vLLM ``LLM``; see the module docstring. Build with ``VLLMEngineConfig.build``.

    Public state: ``version`` (-1 until the first publish), ``last_publish_seconds`` (write +
    reload + prefix-cache reset of the latest publish, excluding the wait for earlier requests),
    ``publish_count``, ``max_model_len``, ``weight_sync`` (the transport, "auto" resolved),
    ``restart_count`` and ``engine_core_pids`` (empty in-process).
    """

    def __init__(self, config: VLLMEngineConfig, model_spec: ModelSpec, tasks: TaskSource) -> None:
        self.config = config
        if config.teacher is not None:  # a wrong teacher fails here, before vLLM starts
            check_teacher(config.teacher, model_spec)
        self._tasks = tasks
        self._workdir = tempfile.mkdtemp(prefix="thundersync-vllm-")
        self._dtype = config.dtype or model_spec.dtype
        lock = None if config.multiprocessing else IN_PROCESS_LOCK
        self._step_lock = lock
        loop: StepLoop[GenerationRequest, Any] | None = None
        self._teacher: VLLMTeacher | None = None
        try:
            self._layout: ModelLayout = materialize_model(model_spec, os.path.join(self._workdir, "model"))
            loop = self._open_loop()
            self.max_model_len: int = int(loop.llm.llm_engine.model_config.max_model_len)
            if config.teacher is not None:
                self._teacher = VLLMTeacher(
                    config.teacher,
                    config.temperature,
                    lambda path, dtype: self._make_llm(path, dtype, teacher=True),
                    self._workdir,
                    close_llm,
                    step_lock=lock,
                )
        except BaseException:
            if loop is not None:
                loop.close()
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        self._core = RestartingCore(loop, self._open_loop, self.weight_sync, config, self._weights_path)
        self._pool = EnvPool(config.env_workers, name="vllm-env")
        self._agents = AgentLoop(  # one for every request: it keeps what ``prepare`` started
            self._tasks,
            self._core.generate,
            self._pool,
            step_timeout_s=self.config.step_timeout_s,
            verdict_timeout_s=self.config.verdict_timeout_s,
            max_batch_size=self.config.max_num_seqs,
            # a teacher's scoring request needs one output slot after the episode
            max_context_tokens=self.max_model_len - (1 if self._teacher is not None else 0),
            annotate=self._teacher,
        )
        self._version = -1
        self._broken: str | None = None
        self._closed = False
        self._order = IssueOrder(
            self._agents.run,
            config.event_limit_s(int(getattr(tasks, "max_turns", 1))),
            "VLLMEngineConfig",
            "vllm-rollout",
        )
        self.last_publish_seconds: float | None = None
        self.publish_count = 0

    # -- RolloutEngine ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def teacher(self) -> TeacherConfig | None:
        """The distillation teacher scoring every trajectory (None: no teacher logprobs)."""
        return self.config.teacher

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        """Load ``weights`` (HF names) in place for every request issued after this call."""
        if self._closed:
            raise EngineError("publish on a shut-down VLLMEngine; build a new engine")
        if self._core.dead is not None:
            raise EngineError(self._core.dead)
        if version < self._version:
            raise EngineError(
                f"publish of version {version} after version {self._version}: versions must not go "
                "back (the staleness of every trajectory is computed from them)"
            )
        check_weights(self._layout, weights)
        with self._order.lock:
            start = time.monotonic()
            path = None
            if self.weight_sync == "file":  # written while earlier requests still generate
                path = self._weights_path()
                save_weights_file(weights, path)
            written = time.monotonic() - start
            self._order.wait_idle(version)
            start = time.monotonic()
            self._broken = f"the publish of version {version} has not completed"
            try:
                self._core.load(weights, path)
            except BaseException as exc:
                if self._core.dead is not None:
                    raise EngineError(self._core.dead) from exc
                self._broken = (
                    f"the publish of version {version} failed half-way ({type(exc).__name__}: {exc}); "
                    "the model mixes old and new weights"
                )
                raise EngineError(
                    f"{self._broken}. Publish a complete state_dict again before the next rollout."
                ) from exc
            finally:
                if path is not None and os.path.exists(path):
                    os.remove(path)
            self._version = version
            self._broken = None
            self.publish_count += 1
            self.last_publish_seconds = written + (time.monotonic() - start)
            log.debug("published version %d in %.3f s", version, self.last_publish_seconds)

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        """Start generating ``request`` now; the iterator yields its events in completion order."""
        return self._order.rollout(request, self._issue_version)

    @property
    def restart_count(self) -> int:
        """How many times a dead engine core was restarted."""
        return self._core.restart_count

    @property
    def engine_core_pids(self) -> tuple[int, ...]:
        """Process ids of the current engine core (empty with ``multiprocessing=False``)."""
        return self._core.pids

    def prepare(self, request: RolloutRequest) -> None:
        """Start ``request``'s environments (``make_env``, ``reset``: prompt tokens) now; return at once.

        Needs no weights and generates nothing; the later ``rollout(request)`` uses them and gives
        the same events as without ``prepare`` (see :meth:`AgentLoop.prepare`).
        """
        if self._closed:
            raise EngineError("prepare on a shut-down VLLMEngine; build a new engine")
        self._agents.prepare(request)

    def shutdown(self) -> None:
        """Stop vLLM (in-flight rollouts fail with EngineError), close prepared environments nobody
        rolled out, and remove temporary files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._teacher is not None:
            self._teacher.close()
        self._core.close()
        self._agents.close_prepared()
        self._pool.shutdown()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- pieces ---------------------------------------------------------------------------------

    def _issue_version(self) -> int:
        """The version a rollout issued now generates with; raises if the engine cannot generate."""
        if self._closed:
            raise EngineError("rollout on a shut-down VLLMEngine; build a new engine")
        if self._core.dead is not None:
            raise EngineError(self._core.dead)
        if self._broken is not None:
            raise EngineError(f"refusing to generate: {self._broken}. Publish a complete state_dict first.")
        if self._version < 0:
            raise EngineError(
                "refusing to generate: no weights published yet (vLLM holds random or checkpoint "
                "weights, not the learner's). Call engine.publish(model.state_dict(), version=0) first."
            )
        return self._version

    def _open_loop(self) -> StepLoop[GenerationRequest, Any]:
        """Start an engine core and the step loop that owns it."""
        loop: StepLoop[GenerationRequest, Any] = StepLoop(
            lambda: self._make_llm(self._layout.path, self._dtype, teacher=False),
            self._request,
            read_generation,
            close_llm,
            step_lock=self._step_lock,
        )
        return loop

    def _make_llm(self, path: str, dtype: str, teacher: bool) -> Any:
        """The policy's ``vllm.LLM`` (``teacher=False``) or the teacher's, with this config's settings;
        a worker-process engine core is tied to this process's life."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if self.config.multiprocessing else "0"
        import vllm.envs
        from vllm import LLM

        if bool(vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING) != self.config.multiprocessing:
            raise EngineError(
                f"this process already started vLLM with multiprocessing={not self.config.multiprocessing} "
                "and vLLM caches that setting; use the same VLLMEngineConfig.multiprocessing for every "
                "engine in a process"
            )
        kwargs: dict[str, Any] = dict(
            model=path,
            skip_tokenizer_init=True,
            dtype=dtype,
            enforce_eager=self.config.enforce_eager,
            seed=self.config.seed,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            # vLLM never reads the prefix cache for a prompt-logprob (teacher) request
            enable_prefix_caching=self.config.enable_prefix_caching and not teacher,
            max_num_seqs=self.config.max_num_seqs,
            tensor_parallel_size=self.config.tensor_parallel_size,
            worker_extension_cls=WORKER_EXTENSION,
        )
        if self.config.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.config.kv_cache_memory_bytes
        else:
            kwargs["gpu_memory_utilization"] = self.config.gpu_memory_utilization
        if teacher:  # the policy's resolved context limit: every episode fits
            kwargs["max_model_len"] = self.max_model_len
        elif self.config.max_model_len is not None:
            kwargs["max_model_len"] = self.config.max_model_len
        learner = learner_cuda_device()
        placed = colocated_device_ids(self.config, learner, vllm_accepts_device_ids())
        if placed is not None:
            kwargs["device_ids"] = placed
        if not teacher:
            devices = list(self.config.engine_kwargs.get("device_ids") or placed or [0])
            self.weight_sync = resolve_weight_sync(self.config, learner, devices, torch.cuda.is_available())
        elif learner and self.config.multiprocessing and "device_ids" not in self.config.engine_kwargs:
            log.warning(
                "this learner rank trains on cuda:%d but its vLLM workers take the first visible GPU (this "
                "vLLM has no device_ids, or tensor_parallel_size > 1): set engine_kwargs.device_ids, or give "
                "each rank its own CUDA_VISIBLE_DEVICES",
                learner,
            )
        kwargs.update(self.config.engine_kwargs)
        if teacher:
            kwargs.update(self.config.teacher_engine_kwargs)
        llm = open_llm(lambda: LLM(**kwargs))
        if self.config.multiprocessing:  # the engine core dies with this process, SIGKILL included
            try:
                llm.collective_rpc("thundersync_die_with", args=(os.getpid(),))
            except BaseException:
                close_llm(llm)
                raise
        return llm

    def _request(self, req: GenerationRequest) -> tuple[tuple[int, ...], Any]:
        return req.prefix, self._sampling_params(req)

    def _sampling_params(self, req: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=self.config.temperature,
            seed=req.seed,
            max_tokens=req.max_new_tokens,
            logprobs=0,
            detokenize=False,
            ignore_eos=True,  # only the task's stop token ends an action
            stop_token_ids=None if req.stop_token is None else [req.stop_token],
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def _weights_path(self) -> str:
        base = self.config.weights_dir if os.path.isdir(self.config.weights_dir) else self._workdir
        return os.path.join(base, f"thundersync-weights-{os.getpid()}-{id(self)}.safetensors")
