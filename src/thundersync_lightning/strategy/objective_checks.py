"""Start-up checks that the learner scores the distribution the engine samples from.

The update is the on-policy gradient only if the learner's per-token log-probabilities are
those of the sampling distribution: same temperature, no truncation (top_p/top_k) the learner
does not apply, and the objective's needs met (engine logprobs for importance correction, a
reference policy for KL, an engine with a teacher for on-policy distillation). Each mismatch is a
:class:`ConfigError` found before any rollout starts, unless the user opted into importance correction, which
reweights the sampled tokens by exp(l - e) (then a warning). At run time the strategy measures the same thing
per step (``StepStats.engine_learner_kl``).

The sampling temperature has one home, the engine config: :func:`share_sampling` hands the engine's
declared :class:`EngineSampling` to a module that scores at it (``use_engine_sampling``, as
``GRPOPolicy`` does). A module that also names a temperature (``hparams.temperature``) is compared:
a different value is one of the mismatches above, the same value a warning that it is redundant.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from ..core.contract import check_engine
from ..core.grpo.objective import Objective
from ..core.protocols import EngineSampling

__all__ = ["check_objective", "module_objective", "share_sampling"]

log = logging.getLogger(__name__)


def module_objective(module: Any) -> Objective:
    """The LightningModule's objective (``module.objective``); the defaults when it has none."""
    objective = getattr(module, "objective", None)
    return Objective.of(objective) if objective is not None else Objective()


def check_objective(module: Any, data: Any) -> list[str]:
    """Problems that make the objective untrainable with this module and engine (warnings logged)."""
    objective = module_objective(module)
    problems = []
    if objective.needs_reference and not getattr(module, "has_reference_policy", False):
        problems.append(
            f"objective.kl_coef={objective.kl_coef} needs a reference policy, and {type(module).__name__} "
            "has none (has_reference_policy is false): set kl_coef=0 or give the module a reference policy"
        )
    engine = getattr(data, "engine_factory", None)
    if engine is None or check_engine(engine):  # an engine off the contract is reported by check_contract
        return problems
    sampling: EngineSampling = engine.sampling
    if objective.needs_teacher and not sampling.teacher:
        problems.append(
            f"objective.opd_coef={objective.opd_coef} needs a teacher's logprobs of every sampled token, and "
            f"{type(engine).__name__} has no teacher: configure one on the engine "
            "(EmbeddedEngineConfig or VLLMEngineConfig: teacher=TeacherConfig(ckpt_path=... or "
            "pretrained_path=...)) or set opd_coef=0"
        )
    if objective.needs_engine_logprobs and not sampling.logprobs:
        problems.append(
            f"objective.is_correction={objective.is_correction!r} needs the engine's sampling logprobs, and "
            f"{type(engine).__name__} reports none: use is_correction='none' or an engine that reports them"
        )
    mismatches = _sampling_mismatches(module, engine)
    if mismatches:
        what = "; ".join(mismatches)
        if objective.is_correction == "none":
            problems.append(
                f"the learner would score another distribution than the engine samples from ({what}): the "
                "update would not be the on-policy gradient. Make the engine's sampling match the policy "
                "(same temperature, top_p=1, top_k off), or opt into importance correction "
                "(objective.is_correction='token_truncate' or another mode) to reweight the sampled tokens"
            )
        else:
            log.warning(
                "the engine samples from another distribution than the learner scores (%s); "
                "objective.is_correction=%r reweights the sampled tokens by exp(logp_learner - logp_engine)",
                what,
                objective.is_correction,
            )
    return problems


def share_sampling(module: Any, data: Any) -> None:
    """Give the module the engine's declared sampling (``module.use_engine_sampling(sampling)``), so
    it scores at the temperature the engine samples at; nothing when either side has no part in it."""
    engine = getattr(data, "engine_factory", None)
    use = getattr(module, "use_engine_sampling", None)
    if engine is not None and callable(use) and not check_engine(engine):
        use(engine.sampling)


def _sampling_mismatches(module: Any, engine: Any) -> list[str]:
    sampling: EngineSampling = engine.sampling
    hparams = getattr(module, "hparams", {})
    learner_t = hparams.get("temperature") if hasattr(hparams, "get") else None
    engine_t = sampling.temperature
    found = []
    if learner_t is not None and engine_t is not None:
        where = f"{type(module).__name__}(temperature={learner_t}) (model.temperature in a config)"
        if float(learner_t) != float(engine_t):
            found.append(
                f"policy temperature {learner_t} vs engine temperature {engine_t}: {where} and "
                f"{type(engine).__name__}(temperature={engine_t}) differ; the temperature's home is the "
                "engine config: drop the policy's, it scores at the engine's"
            )
        else:
            rank_zero_warn(
                f"{where} repeats {type(engine).__name__}(temperature={engine_t}): the policy scores at the "
                "engine's sampling temperature, read at set-up; drop the policy's temperature"
            )
    if sampling.top_p < 1.0:
        found.append(f"engine top_p={sampling.top_p} < 1 truncates sampling")
    if sampling.top_k > 0:
        found.append(f"engine top_k={sampling.top_k} truncates sampling")
    return found
