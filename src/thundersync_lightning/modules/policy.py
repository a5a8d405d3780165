"""``GRPOPolicy``: a Hugging Face causal LM as a LightningModule the strategy can stream.

Notation: trajectory i is tokens x_1..x_T with a scored mask m_t (policy-generated tokens);
the learner's per-token log-probabilities are

    l_t = log softmax(z_{t-1} / T)[x_t]   at scored t

with z the logits and T the engine's sampling temperature (the engine reports logprobs of the same
temperature-scaled distribution). T has one home, the engine config: the strategy hands the engine's
declared :class:`~thundersync_lightning.core.EngineSampling` to :meth:`use_engine_sampling` at
set-up. :meth:`score_tokens` is the one hook the strategy calls: it returns l (and, when the
objective asks, entropies and the reference policy's log-probabilities) as
:class:`~thundersync_lightning.core.TokenScores`; the module's
:class:`~thundersync_lightning.core.Objective` (``objective=``, saved with the checkpoint) turns
them into the loss in every mode. :meth:`training_step` computes the same loss in one expression
so the module also trains under stock strategies.

The reference policy of the KL term is the initial weights: with LoRA the base model with the
adapters disabled (no copy), otherwise a frozen copy made at construction (``reference_bytes``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from torchmetrics import MeanMetric
from typing_extensions import override

from ..core.accumulator.boundary_cut import SharedPrefix
from ..core.batches import RolloutBatch
from ..core.contract import pretrained_path_problem
from ..core.errors import ConfigError
from ..core.evaluation import VALIDATION_METRICS, ValidationBatch, ValidationOutcome, collect_validation
from ..core.gradients.backward import ForwardWatch
from ..core.grpo.objective import BatchTotals, Objective
from ..core.grpo.terms import (
    TokenScores,
    reference_loss,
)
from ..core.options import trl_hint
from ..core.protocols import EngineSampling
from ..core.scoring import objective_terms, score_needs, step_entropy_threshold
from ..core.types import ModelSpec, Trajectory
from ..envs.chat import ChatRenderer
from ..rollout.hf_model import build_model, cache_kwarg
from .collect import collect_batch
from .lora import LoraSettings, apply_lora, merged_state_dict
from .micro_batches import micro_batches

__all__ = ["GRPOPolicy", "TINY_QWEN3"]

log = logging.getLogger(__name__)

_MOVED = {
    "estimator": "objective.estimator",
    "eps": "objective.eps",
    "token_weighting": (
        "objective.loss_agg ('seq-mean-token-mean' divides each sequence by its scored tokens)"
    ),
}

#: A tiny random Qwen3 (head_dim 64 so vLLM accepts it too); the toy task overrides vocab_size.
TINY_QWEN3: dict[str, Any] = {
    "vocab_size": 32,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


class GRPOPolicy(LightningModule):
    """A causal LM policy trained by GRPO.

    Args:
        model_type: a transformers model type (random init from ``config``; no download).
        config: keyword arguments of that model's config (default: a tiny Qwen3).
        pretrained_path: a local directory to load instead (``from_pretrained``, offline).
        dtype: parameter dtype.
        lr, weight_decay, betas: AdamW.
        temperature: leave unset: the policy scores at the engine's sampling temperature, which the
            strategy reads from the engine config at set-up (:meth:`use_engine_sampling`; 1.0 before
            any fit). A value given here that differs from the engine's is a ``ConfigError`` at
            set-up (unless ``objective.is_correction`` reweights the sampled tokens), one equal to
            it a warning that it is redundant.
        objective: the training objective: an :class:`~thundersync_lightning.core.Objective`, a
            preset name (``thundersync``, ``verl``, ``trl``) or a mapping of its fields (``preset``
            allowed). Every mode of the strategy trains exactly this objective.
        lora: optional LoRA settings (peft); then only adapters train.
        score_batch_tokens: padded-token budget of one forward in :meth:`trajectory_logprobs`;
            trajectories are sorted by length and packed into micro-batches under it, so a large
            batch (the synchronous baseline) wastes no compute on padding and bounds activations.
        score_max_padding: a micro-batch's padded tokens are at most (1 + this) x its real tokens
            (:mod:`~thundersync_lightning.modules.micro_batches`): a batch that mixes lengths (the
            streaming learner's, across groups) runs as several forwards rather than paying for
            padding; the backward stays one. ``float("inf")``: cut by ``score_batch_tokens`` only.
        score_forward_tokens: one forward's fixed cost (launches, the model's Python) in padded
            tokens: a micro-batch may also carry this many padded tokens beyond its real ones
            whatever ``score_max_padding`` says, since cutting it would cost another forward. It
            matters for short trajectories (a few to a few hundred tokens); longer ones are cut by
            ``score_max_padding`` as before. 0: ``score_max_padding`` alone.
    """

    def __init__(
        self,
        model_type: str = "qwen3",
        config: Mapping[str, Any] | None = None,
        pretrained_path: str | None = None,
        dtype: str = "float32",
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        temperature: float | None = None,
        objective: Objective | str | dict[str, Any] | None = None,
        lora: LoraSettings | None = None,
        score_batch_tokens: int = 8192,
        score_max_padding: float = 0.25,
        score_forward_tokens: int = 64,
        **unknown: Any,
    ) -> None:
        super().__init__()
        problems = []
        for name in unknown:
            hint = (
                f"it moved to {_MOVED[name]}"
                if name in _MOVED
                else f"it is not an option of GRPOPolicy{trl_hint(name)}"
            )
            problems.append(f"{name}={unknown[name]!r}: {hint}")
        if score_batch_tokens < 1:
            problems.append(f"score_batch_tokens must be >= 1, got {score_batch_tokens}")
        if not score_max_padding >= 0:
            problems.append(f"score_max_padding must be >= 0, got {score_max_padding}")
        if score_forward_tokens < 0:
            problems.append(f"score_forward_tokens must be >= 0, got {score_forward_tokens}")
        if temperature is not None and not temperature > 0:
            problems.append(f"temperature must be > 0, got {temperature}")
        missing = pretrained_path_problem(pretrained_path)
        if missing is not None:
            problems.append(missing)
        if problems:
            raise ConfigError("GRPOPolicy: " + "; ".join(problems))
        self._objective = Objective.of(objective)
        self.save_hyperparameters(ignore=["objective", "unknown"])
        self.hparams["objective"] = self._objective.to_dict()  # plain data in hparams and checkpoints
        self.save_hyperparameters(
            dict(self.hparams)
        )  # hparams_initial (the run config loggers get) has it too
        self._spec = ModelSpec(
            model_type=model_type,
            config=dict(TINY_QWEN3 if config is None else config),
            pretrained_path=pretrained_path,
            dtype=dtype,
        )
        model = build_model(self._spec).train()
        self.model = apply_lora(model, lora) if lora is not None else model
        self.reference: torch.nn.Module | None = None
        self._engine_temperature: float | None = None  # EngineSampling.temperature, given at set-up
        self._chat: ChatRenderer | None = None
        # held-out metrics (no persistent state: checkpoints are unchanged)
        self.val_metrics = torch.nn.ModuleDict(
            {name: MeanMetric(nan_strategy="ignore").set_dtype(torch.float64) for name in VALIDATION_METRICS}
        )
        if self._objective.needs_reference and lora is None:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
            log.info(
                "KL reference policy: a frozen copy of the initial weights (%d bytes)", self.reference_bytes
            )

    @property
    def objective(self) -> Objective:
        """What every mode of the strategy minimises (saved in hparams and checkpoints)."""
        return self._objective

    @property
    def temperature(self) -> float:
        """T the scores use: the ``temperature`` given, else the engine's sampling temperature (read at
        set-up), else 1.0 (no engine seen yet, or one that samples from no model: a trace replay)."""
        given = self.hparams.temperature
        if given is not None:
            return float(given)
        return 1.0 if self._engine_temperature is None else self._engine_temperature

    def use_engine_sampling(self, sampling: EngineSampling) -> None:
        """Score at the temperature the engine samples at (the strategy calls this at set-up, after
        ``strategy/objective_checks.py`` compared the two)."""
        self._engine_temperature = sampling.temperature

    @property
    def has_reference_policy(self) -> bool:
        """The initial weights are available for the KL term (adapters off, or a frozen copy)."""
        return self.hparams.lora is not None or self.reference is not None

    @property
    def reference_bytes(self) -> int:
        """Memory held by the frozen reference copy (0 with LoRA: the base model serves)."""
        if self.reference is None:
            return 0
        return sum(t.numel() * t.element_size() for t in self.reference.state_dict().values())

    @property
    def chat_renderer(self) -> ChatRenderer:
        """The chat template of the tokenizer saved with ``pretrained_path`` (the same renderer the
        environments use, e.g. ``DatasetTasks(tokenizer_path=<the same directory>)``)."""
        if self._spec.pretrained_path is None:
            raise ConfigError(
                "GRPOPolicy.chat_renderer needs pretrained_path (a model directory with its tokenizer)"
            )
        if self._chat is None:
            self._chat = ChatRenderer(self._spec.pretrained_path)
        return self._chat

    def render_chat(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
    ) -> Tensor:
        """Token ids of a conversation under the model's chat template, shape (T,)."""
        return torch.tensor(self.chat_renderer.render(messages, add_generation_prompt), dtype=torch.long)

    @property
    def vocab_size(self) -> int:
        """Token ids the policy embeds (rows of the input embedding)."""
        return int(self.model.get_input_embeddings().num_embeddings)

    @property
    def model_spec(self) -> ModelSpec:
        """How engines build their own copy of this architecture."""
        return self._spec

    def weights_for_engine(self) -> dict[str, Tensor]:
        """Hugging Face names -> weights (LoRA merged), sharing storage where nothing is merged."""
        if self.hparams.lora is not None:
            return merged_state_dict(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------------ scores and loss
    def encode_prefix(self, tokens: Sequence[int]) -> SharedPrefix:
        """The boundary cut: run a group's shared prompt forward once (graph kept); continuations
        scored with ``prefix=`` read detached leaves of its per-layer keys/values and last logits."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True)
        outputs: list[Tensor] = []
        for layer in out.past_key_values.layers:
            outputs += [layer.keys, layer.values]  # (1, kv_heads, P, head_dim) each
        outputs.append(out.logits[:, -1])  # (1, V): predicts the first continuation token
        leaves = tuple(t.detach().requires_grad_(True) for t in outputs)
        return SharedPrefix(tuple(int(t) for t in tokens), tuple(outputs), leaves)

    def score_tokens(
        self,
        trajectories: Sequence[Trajectory],
        *,
        entropy: bool = False,
        reference: bool = False,
        prefix: SharedPrefix | None = None,
        watch: ForwardWatch | None = None,
    ) -> TokenScores:
        """Per-token log-probabilities of every scored token, shape (n, L), a graph to the trainable
        parameters; with ``entropy`` the per-position entropies (graph), with ``reference`` the
        reference policy's log-probabilities (no graph). With ``prefix`` (from
        :meth:`encode_prefix`) every trajectory must start with its tokens; only the continuations
        run forward, positions start after the prefix, and gradients also reach the prefix leaves.

        Trajectories are scored in length-sorted micro-batches of at most ``score_batch_tokens``
        padded tokens and ``1 + score_max_padding`` padded tokens per real token; rows come back in the order
        given, right-padded to the longest.

        ``watch``: the learner call's backward backend watches its forwards
        (:class:`~thundersync_lightning.core.gradients.backward.ForwardWatch`): scoring runs inside ``with
        watch:`` and each micro-batch forward inside ``watch.rows(index)``, ``index`` the batch row
        of each of its rows.
        """
        if prefix is not None:
            bad = [
                t.trajectory_id
                for t in trajectories
                if tuple(t.tokens[: len(prefix.tokens)]) != prefix.tokens
            ]
            if bad or any(len(t.tokens) <= len(prefix.tokens) for t in trajectories):
                raise ConfigError(
                    f"boundary cut: trajectories {bad[:4] or [t.trajectory_id for t in trajectories]} do not "
                    f"continue the group's shared prefix of {len(prefix.tokens)} tokens (a group's members "
                    "must share their prompt); turn boundary_cut off for tasks whose members share no prefix"
                )
        lengths = [len(t.tokens) for t in trajectories]
        chunks = micro_batches(
            lengths,
            self.hparams.score_batch_tokens,
            self.hparams.score_max_padding,
            self.hparams.score_forward_tokens,
        )
        order = [i for chunk in chunks for i in chunk]
        if watch is None:
            parts = [
                self._score_padded([trajectories[i] for i in c], entropy, reference, prefix) for c in chunks
            ]
        else:
            parts = []
            with watch:
                for chunk in chunks:
                    with watch.rows(chunk):
                        parts.append(
                            self._score_padded([trajectories[i] for i in chunk], entropy, reference, prefix)
                        )
        width = max(p[0].shape[1] for p in parts)

        def cat(k: int) -> Tensor | None:
            if parts[0][k] is None:
                return None
            return torch.cat([torch.nn.functional.pad(p[k], (0, width - p[k].shape[1])) for p in parts])

        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        inverse = inverse.to(self.device)
        picked = [cat(k) for k in range(4)]
        lp, mask, ent, ref = (t[inverse] if t is not None else None for t in picked)
        return TokenScores(lp, mask.bool(), ent, ref)  # type: ignore[union-attr,arg-type]

    def _score_padded(
        self,
        trajectories: Sequence[Trajectory],
        entropy: bool,
        reference: bool,
        prefix: SharedPrefix | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """One right-padded forward over ``trajectories``: (n, L-1) logprobs, mask, entropy, reference.

        No padding mask: pads only follow a row's real tokens, so under the causal mask no real
        position sees one and its logits are exactly those of the row alone (positions count from
        0 either way). SDPA then takes its causal path and saves no (n, L, L) mask for backward.
        """
        if prefix is not None:
            return self._score_continuations(trajectories, entropy, reference, prefix)
        n = len(trajectories)
        # at least two positions: a trajectory that failed before its prompt (a row that cannot be
        # scored) has no token; it is pads with nothing scored, S_i = 0, and the batch still runs
        length = max(2, *(len(t.tokens) for t in trajectories))
        ids = torch.zeros((n, length), dtype=torch.long)
        scored = torch.zeros((n, length), dtype=torch.bool)
        for row, t in enumerate(trajectories):
            tokens = t.tokens
            ids[row, : len(tokens)] = torch.tensor(tokens)
            scored[row, : len(tokens)] = torch.tensor(t.scored_mask, dtype=torch.bool)
        ids, scored = ids.to(self.device), scored.to(self.device)
        target = ids[:, 1:]
        logits = self.model(input_ids=ids).logits  # (n, L, V)
        lp, z = self._token_logprobs(logits, target)  # (n, L-1), (n, L-1, V)
        ent = None
        if entropy:
            ent = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)  # (n, L-1)
        ref = None
        if reference:
            ref = self._reference_logprobs(ids, None, target)
        return lp, scored[:, 1:], ent, ref

    def _score_continuations(
        self, trajectories: Sequence[Trajectory], entropy: bool, reference: bool, prefix: SharedPrefix
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Continuations on the prefix leaves: (n, C) over the tokens after the prefix."""
        from transformers import DynamicCache

        n, p = len(trajectories), len(prefix.tokens)
        length = max(len(t.tokens) for t in trajectories)
        ids = torch.zeros((n, length), dtype=torch.long)
        attention = torch.zeros((n, length), dtype=torch.long)
        scored = torch.zeros((n, length), dtype=torch.bool)
        for row, t in enumerate(trajectories):
            ids[row, : len(t.tokens)] = torch.tensor(t.tokens)
            attention[row, : len(t.tokens)] = 1
            scored[row, : len(t.tokens)] = torch.tensor(t.scored_mask, dtype=torch.bool)
        ids, attention, scored = ids.to(self.device), attention.to(self.device), scored.to(self.device)
        cache = DynamicCache(config=self.model.config)
        kv, last = prefix.leaves[:-1], prefix.leaves[-1]
        for layer in range(len(kv) // 2):
            cache.update(kv[2 * layer].expand(n, -1, -1, -1), kv[2 * layer + 1].expand(n, -1, -1, -1), layer)
        positions = torch.arange(p, length, device=self.device).expand(n, -1)
        out = self.model(
            input_ids=ids[:, p:],
            attention_mask=attention,
            position_ids=positions,
            **{cache_kwarg(self.model): cache},
        )
        logits = torch.cat([last.expand(n, -1)[:, None], out.logits], dim=1)  # (n, C+1, V)
        lp, z = self._token_logprobs(logits, ids[:, p:])  # (n, C), (n, C, V)
        ent = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1) if entropy else None
        ref = self._reference_logprobs(ids, attention, ids[:, 1:])[:, p - 1 :] if reference else None
        return lp, scored[:, p:], ent, ref

    def _token_logprobs(self, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        z = logits[:, :-1]  # predicts tokens 1..L-1
        z = z.to(torch.promote_types(z.dtype, torch.float32)) / self.temperature
        lp = z.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
        return lp, z

    @torch.no_grad()
    def _reference_logprobs(self, ids: Tensor, attention: Tensor | None, target: Tensor) -> Tensor:
        if self.reference is not None:
            logits = self.reference(input_ids=ids, attention_mask=attention).logits
        elif self.hparams.lora is not None:
            with self.model.disable_adapter():
                logits = self.model(input_ids=ids, attention_mask=attention).logits
        else:
            raise ConfigError(
                "the objective has kl_coef != 0 but this GRPOPolicy was built without a reference policy; "
                "construct it with the objective (the reference copy is made at construction)"
            )
        return self._token_logprobs(logits, target)[0]

    def trajectory_logprobs(self, trajectories: Sequence[Trajectory]) -> Tensor:
        """S_i = sum of each trajectory's scored-token logprobs, shape (n,) (a convenience)."""
        scores = self.score_tokens(trajectories)
        return (scores.logprobs * scores.mask).sum(-1)

    def grpo_loss(
        self,
        trajectories: Sequence[Trajectory],
        rewards: Sequence[float],
        failed: Sequence[bool] | None = None,
        totals: BatchTotals | None = None,
        *,
        host_fault: Sequence[bool] | None = None,
        unscorable: Sequence[bool] | None = None,
    ) -> Tensor:
        """The objective's L over a complete batch in one expression (one forward, one backward);
        ``rewards`` are the verdicts (the objective shapes them, ``Objective.shaped_reward``; a
        shaped reward beyond ``max_abs_reward`` counts as a failure). ``failed``, ``host_fault``,
        ``unscorable``: per trajectory, as :func:`~thundersync_lightning.core.grpo.terms.reference_loss`.

        ``totals``: the global counts under data parallelism (default: this batch's own).
        """
        obj = self._objective
        scores = self.score_tokens(trajectories, **score_needs(obj))
        # this batch is the step: its own entropy quantile (one process)
        threshold = step_entropy_threshold(
            obj, [scores.entropy[scores.mask]] if scores.entropy is not None else []
        )
        terms = objective_terms(obj, trajectories, scores, threshold)
        n = len(trajectories)
        failed = list(failed) if failed is not None else [False] * n
        unscored = list(unscorable) if unscorable is not None else [False] * n
        graded = [not (f or u) for f, u in zip(failed, unscored)]
        rewards = [
            obj.shaped_reward(float(r), t.num_scored_tokens) if g else float(r)
            for r, t, g in zip(rewards, trajectories, graded)
        ]
        refused = [g and obj.refused_reward(r) is not None for r, g in zip(rewards, graded)]
        host = list(host_fault) if host_fault is not None else failed
        return reference_loss(
            obj,
            terms,
            [t.group_id for t in trajectories],
            rewards,
            [f or x for f, x in zip(failed, refused)],
            totals,
            host_fault=[h and f for h, f in zip(host, failed)],
            unscorable=unscored,
        )

    @override
    def training_step(self, batch: RolloutBatch, batch_idx: int) -> Tensor:
        """Synchronous GRPO under any stock strategy: publish, wait for the whole batch, one loss."""
        if batch.dynamic_sampling:
            raise ConfigError(
                "RolloutDataModule(dynamic_sampling=True) issues replacement groups inside the step, which "
                "needs strategy='thundersync' (any mode); under a stock strategy set dynamic_sampling=False"
            )
        got = collect_batch(
            batch, self.global_step, self.weights_for_engine(), self.global_rank, self.trainer.world_size
        )
        return self.grpo_loss(
            got.trajectories, got.rewards, got.failed, host_fault=got.host_fault, unscorable=got.unscorable
        )

    @override
    def validation_step(self, batch: ValidationBatch | ValidationOutcome, batch_idx: int) -> None:
        """Log a held-out batch's metrics (``val/...``). Under strategy='thundersync' the strategy has
        already run the rollouts; under a stock strategy this publishes the weights and runs them."""
        if isinstance(batch, ValidationBatch):
            engine, step = batch.engine, self.global_step
            if engine.version != step:
                engine.publish(self.weights_for_engine(), step)
            request = batch.request(self.global_rank, self.trainer.world_size)
            batch = collect_validation(batch, request, engine.rollout(request), step)
        # torchmetrics weighted means: reduced over ranks by counts at epoch end (a mean of per-rank
        # means would weigh ranks equally however many tasks each had, and a rank without tasks
        # would skip the collective); every rank updates and logs every metric in every batch.
        for name, (value, weight) in batch.weighted_metrics().items():
            metric = self.val_metrics[name]
            metric.update(
                torch.tensor(value, dtype=torch.float64), torch.tensor(float(weight), dtype=torch.float64)
            )
            self.log(f"val/{name}", metric, on_step=False, on_epoch=True)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params,
            lr=self.hparams.lr,
            weight_decay=self.hparams.weight_decay,
            betas=tuple(self.hparams.betas),
        )
