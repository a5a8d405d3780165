"""The vLLM engine against a transformers reference, on CPU (real vLLM, tiny Qwen3)."""

from __future__ import annotations

import threading

import pytest
import torch

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest, group_id

from .tasks import OBS, STOP, TEMPERATURE, Task, make_learner, reference_logprobs

pytestmark = pytest.mark.vllm


class _Models:
    """Learner weights A and B, built on first use (not at collection: `make test` collects this file too)."""

    def __getattr__(self, name: str):
        seeds = {"A": 1, "B": 2}
        if name not in seeds:
            raise AttributeError(name)
        model = make_learner(seeds[name])
        setattr(self, name, model)
        return model


MODELS = _Models()


def request(step: int, groups: dict[int, int], seed: int = 7) -> RolloutRequest:
    """groups: group_index -> size."""
    return RolloutRequest(
        step=step,
        groups=tuple(GroupRequest(group_id(step, g), g, Task(g), n) for g, n in groups.items()),
        seed=seed,
    )


def collect(events) -> tuple[dict, dict, list]:
    """(trajectory_id -> Trajectory, trajectory_id -> reward, event order)."""
    trajs, rewards, order = {}, {}, []
    for ev in events:
        if isinstance(ev, ContentReady):
            assert ev.trajectory.trajectory_id not in trajs
            trajs[ev.trajectory.trajectory_id] = ev.trajectory
            order.append(("content", ev.trajectory.trajectory_id))
        else:
            assert isinstance(ev, RewardReady)
            assert ev.trajectory_id in trajs, "a reward arrived before its trajectory's content"
            assert ev.trajectory_id not in rewards
            rewards[ev.trajectory_id] = ev.reward
            order.append(("reward", ev.trajectory_id))
    return trajs, rewards, order


def max_logprob_error(model, trajs) -> float:
    err = 0.0
    for t in trajs.values():
        ref = reference_logprobs(model, t)
        assert len(ref) == len(t.sampling_logprobs) == t.num_scored_tokens > 0
        err = max(err, max(abs(a - b) for a, b in zip(ref, t.sampling_logprobs)))
    return err


def publish(engine, model, version: int) -> None:
    engine.publish(model.state_dict(), version)
    assert engine.version == version
    assert engine.last_publish_seconds is not None and engine.last_publish_seconds >= 0


@pytest.fixture(autouse=True)
def weights_a(engine):
    """Every test starts from MODELS.A published under the next version."""
    publish(engine, MODELS.A, engine.version + 1)


def test_sampled_token_logprobs_match_a_transformers_forward_of_the_same_weights(engine):
    trajs, rewards, _ = collect(engine.rollout(request(step=0, groups={0: 3, 1: 3})))

    assert set(trajs) == set(rewards) and len(trajs) == 6
    for t in trajs.values():
        assert t.policy_version == engine.version
        assert t.num_turns == 3 and t.finish_reason == "submit"
        actions = [s for s in t.segments if s.scored]
        observations = [s for s in t.segments if not s.scored]
        assert len(actions) == 3 and all(o.tokens[0] == OBS for o in observations)
        assert all(len(a.tokens) == 4 or a.tokens[-1] == STOP for a in actions)
        assert STOP not in [tok for a in actions for tok in a.tokens[:-1]]
        assert rewards[t.trajectory_id] == sum(a.tokens[-1] == STOP for a in actions)
    assert max_logprob_error(MODELS.A, trajs) <= 1e-4


def test_a_publish_changes_the_next_generation_and_the_logprobs_follow_the_new_weights(engine):
    before, _, _ = collect(engine.rollout(request(step=1, groups={0: 4})))
    publish(engine, MODELS.B, engine.version + 1)
    after, _, _ = collect(engine.rollout(request(step=1, groups={0: 4})))

    assert {t.policy_version for t in after.values()} == {engine.version}
    assert [t.tokens for t in before.values()] != [after[k].tokens for k in before]
    assert max_logprob_error(MODELS.B, after) <= 1e-4
    assert max_logprob_error(MODELS.A, after) > 1e-2  # the old weights are really gone


def test_a_publish_after_a_rollout_is_issued_applies_to_later_rollouts_only(engine):
    v_old = engine.version
    first = engine.rollout(request(step=2, groups={0: 3, 1: 2}))  # issued, not consumed yet
    publish(engine, MODELS.B, v_old + 1)
    second = engine.rollout(request(step=2, groups={0: 3, 1: 2}))
    old, _, _ = collect(first)
    new, _, _ = collect(second)

    assert {t.policy_version for t in old.values()} == {v_old}
    assert {t.policy_version for t in new.values()} == {v_old + 1}
    assert max_logprob_error(MODELS.A, old) <= 1e-4
    assert max_logprob_error(MODELS.B, new) <= 1e-4


def test_events_are_delivered_in_completion_order_not_issue_order(engine, turn_tasks):
    gate = threading.Event()
    turn_tasks.gates[0] = gate  # group 0 cannot finish before group 1 has been delivered
    try:
        order = []
        g1_left = 3
        for ev in engine.rollout(request(step=3, groups={0: 2, 1: 3})):
            if isinstance(ev, ContentReady):
                order.append(ev.trajectory.group_id)
                if ev.trajectory.group_id.endswith("g1"):
                    g1_left -= 1
                    if g1_left == 0:
                        gate.set()
    finally:
        turn_tasks.gates.clear()
        gate.set()
    assert order == ["s3-g1"] * 3 + ["s3-g0"] * 2


def test_the_same_seed_gives_the_same_tokens_whatever_the_batch(engine):
    full, _, _ = collect(engine.rollout(request(step=4, groups={0: 3, 1: 3, 2: 3})))
    alone, _, _ = collect(engine.rollout(request(step=4, groups={1: 3})))
    bigger, _, _ = collect(engine.rollout(request(step=4, groups={1: 5, 3: 2})))
    other_seed, _, _ = collect(engine.rollout(request(step=4, groups={1: 3}, seed=8)))

    for k in range(3):
        tid = f"s4-g1-t{k}"
        assert full[tid].tokens == alone[tid].tokens == bigger[tid].tokens
        assert full[tid].sampling_logprobs == pytest.approx(alone[tid].sampling_logprobs, abs=1e-5)
    assert [other_seed[f"s4-g1-t{k}"].tokens for k in range(3)] != [
        alone[f"s4-g1-t{k}"].tokens for k in range(3)
    ]


def test_a_publish_with_wrong_names_or_shapes_is_refused_before_anything_is_loaded(engine):
    version = engine.version
    weights = dict(MODELS.B.state_dict())
    del weights["model.norm.weight"]
    with pytest.raises(EngineError, match="missing 1 tensors"):
        engine.publish(weights, version + 1)
    weights = dict(MODELS.B.state_dict())
    weights["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(EngineError, match="shape"):
        engine.publish(weights, version + 1)

    assert engine.version == version
    trajs, _, _ = collect(engine.rollout(request(step=5, groups={0: 2})))
    assert max_logprob_error(MODELS.A, trajs) <= 1e-4


def test_a_half_loaded_model_refuses_to_generate_until_a_complete_publish(engine):
    version = engine.version
    weights = dict(MODELS.B.state_dict())
    weights["model.norm.weight"] = torch.empty(weights["model.norm.weight"].shape, device="meta")
    with pytest.raises(EngineError, match="half-way"):
        engine.publish(weights, version + 1)
    assert engine.version == version
    with pytest.raises(EngineError, match="refusing to generate"):
        engine.rollout(request(step=6, groups={0: 1}))

    publish(engine, MODELS.B, version + 1)
    trajs, _, _ = collect(engine.rollout(request(step=6, groups={0: 2})))
    assert max_logprob_error(MODELS.B, trajs) <= 1e-4


def test_a_version_older_than_the_published_one_is_refused(engine):
    with pytest.raises(EngineError, match="must not go"):
        engine.publish(MODELS.A.state_dict(), engine.version - 1)


def _on_policy_kl(model, trajs, temperature: float) -> float:
    """The learner-side on-policy statistic (core.trajectory_terms) for vLLM's trajectories."""
    from thundersync_lightning.core import Objective, TokenScores, engine_logprobs, trajectory_terms

    rows = list(trajs.values())
    width = max(len(t.tokens) for t in rows) - 1
    lp = torch.zeros(len(rows), width, dtype=torch.float32)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    with torch.no_grad():
        for i, t in enumerate(rows):
            ids = torch.tensor([t.tokens])
            logp = torch.log_softmax(model(ids).logits[0].float() / temperature, dim=-1)[:-1]  # (L-1, V)
            lp[i, : len(t.tokens) - 1] = logp.gather(1, ids[0, 1:, None]).squeeze(1)
            mask[i, : len(t.tokens) - 1] = torch.tensor(t.scored_mask[1:])
    scores = TokenScores(lp, mask)
    terms = trajectory_terms(Objective(), scores, engine_logprobs(rows, mask, torch.float32))
    assert terms.on_policy.tokens == sum(t.num_scored_tokens for t in rows)
    return terms.on_policy.kl


def test_the_measured_engine_learner_kl_is_zero_on_policy_and_catches_a_temperature_mismatch(engine):
    trajs, _, _ = collect(engine.rollout(request(step=0, groups={0: 4, 1: 4})))
    assert _on_policy_kl(MODELS.A, trajs, TEMPERATURE) < 1e-6
    assert _on_policy_kl(MODELS.A, trajs, TEMPERATURE * 1.5) > 1e-3
