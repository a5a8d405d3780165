"""The memory planner's rows, bounds, sharding and verdicts, checked against hand-computed bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.planning.memory_plan import (
    Architecture,
    ModelShape,
    PlanInputs,
    parse_bytes,
    plan_memory,
)

P = 1_000_000  # parameters of the hand-computed examples
ARCH = Architecture(layers=2, hidden=64, intermediate=128, q_dim=64, kv_dim=32, vocab=100, max_positions=64)


def inputs(**kw) -> PlanInputs:
    model = kw.pop("model", ModelShape(P, P, 4, ARCH, lora_params_per_rank=ARCH.lora_params_per_rank))
    base = dict(
        model=model, groups_per_step=8, group_size=4, max_tokens_per_trajectory=64, max_batch_trajectories=4
    )
    return PlanInputs(**{**base, **kw})


def test_every_row_of_a_streaming_plan_matches_the_formula_of_the_module_docstring():
    plan = plan_memory(inputs(max_open_groups=2, max_held_trajectories=3))
    by_name = {r.name: r.device for r in plan.rows}
    # e = a = 4 bytes; AdamW keeps 2 states; 2 open groups x 2 sums; 3 held; one step gradient
    assert by_name["weights"] == 4 * P
    assert by_name["gradients"] == 4 * P
    assert by_name["optimizer state"] == 2 * 4 * P
    assert by_name["group sums"] == 2 * 2 * 4 * P
    assert by_name["held gradients"] == 3 * 4 * P
    assert by_name["step gradient"] == 4 * P
    assert by_name["backward"] == 4 * P
    # 4 trajectories x 64 tokens x (2 layers x b_layer + (5 + 8) h + V (4 + 8))
    b_layer = 2 * 8 * 64 + 8 * (64 + 32) + 4 * (64 + 64) + 4 * (128 + 64) + 16 * 128
    assert by_name["activations"] == 4 * 64 * (2 * b_layer + 13 * 64 + 100 * 12)
    assert plan.host_bytes == 0


def test_unbounded_limits_are_planned_at_their_worst_case_and_the_table_says_so():
    plan = plan_memory(inputs(world_size=2))  # 8 groups over 2 ranks: 4 per rank, 16 trajectories
    # every trajectory of the open groups held: no member's reward known, so no sum (G per group)
    assert plan.row("group sums").device == 0
    assert plan.row("held gradients").device == 16 * 4 * P
    table = plan.table()
    assert "max_open_groups unbounded: every group of the step on this rank" in table
    assert "max_held_trajectories unbounded: every trajectory of the open groups" in table


@pytest.mark.parametrize(
    "group_size, open_groups, held, sums",
    [(4, 2, 4, 4), (4, 2, 7, 1), (4, 2, 8, 0), (2, 3, 0, 3), (2, 3, 4, 2), (1, 2, 0, 0), (8, 1, 3, 2)],
)
def test_sums_and_held_gradients_are_bounded_by_what_an_unfolded_group_can_keep(
    group_size, open_groups, held, sums
):
    # a group keeps <= min(2, G - 1) sums (it folds once every member is scored and known) and, with
    # h held members, <= G buffers: every buffer belongs to a scored member of an unfolded group
    plan = plan_memory(inputs(group_size=group_size, max_open_groups=open_groups, max_held_trajectories=held))
    assert plan.inputs.sum_buffers == sums
    assert plan.row("group sums").device == sums * 4 * P
    assert plan.row("held gradients").device == held * 4 * P


def test_the_held_bound_never_exceeds_the_trajectories_of_the_open_groups():
    assert inputs(max_open_groups=1, max_held_trajectories=100).held_trajectories == 4


def test_offload_moves_sums_and_held_gradients_to_the_host_and_adds_device_staging():
    none, pinned = (
        plan_memory(inputs(max_open_groups=1)),
        plan_memory(inputs(max_open_groups=1, offload="pinned")),
    )
    moved = none.bytes_of("group sums", "held gradients")
    assert pinned.pinned_host_bytes == moved + 2 * 4 * P  # and the two buffers the copies land in
    assert pinned.device_bytes == none.device_bytes - moved + 2 * 4 * P  # double-buffered staging
    cpu = plan_memory(inputs(max_open_groups=1, offload="cpu"))
    assert cpu.pageable_host_bytes == moved and cpu.pinned_host_bytes == 0


def test_a_held_trajectory_holds_two_gradients_when_failed_ones_are_dropped_with_regulariser_terms():
    one, two = (
        plan_memory(inputs(max_held_trajectories=3)),
        plan_memory(inputs(max_held_trajectories=3, held_regulariser=True)),
    )
    assert one.row("held gradients").total == 3 * 4 * P
    assert two.row("held gradients").total == 2 * 3 * 4 * P
    assert plan_memory(inputs(max_held_trajectories=0)).row("held gradients").total == 0  # 0: never hold


def test_sync_mode_holds_no_sums_because_every_reward_is_known_when_scored():
    plan = plan_memory(inputs(mode="sync", offload="cpu"))
    assert plan.row("group sums").total == plan.row("held gradients").total == 0
    assert "staging" not in [r.name for r in plan.rows]


@pytest.mark.parametrize(
    "sharding, weights, grads, state",
    [
        ("none", 4 * P, 4 * P, 8 * P),
        ("zero1", 4 * P, 4 * P, 8 * P / 4),  # optimizer state over 4 ranks
        ("fsdp2", 4 * P / 4 + 4 * P, 4 * P / 4, 8 * P / 4),  # shards + one gathered copy per step
    ],
)
def test_each_sharding_divides_what_it_shards_by_the_world_size(sharding, weights, grads, state):
    plan = plan_memory(inputs(world_size=4, sharding=sharding, max_open_groups=1, max_held_trajectories=0))
    assert plan.row("weights").device == weights
    assert plan.row("gradients").device == grads
    assert plan.row("optimizer state").device == state
    assert plan.row("group sums").device == 2 * 4 * P  # sums of local trajectories are never sharded
    assert plan.row("collective").device == 4 * P  # the all-reduce (fsdp2: reduce-scatter) input


def test_lora_shrinks_sums_gradients_and_state_to_the_adapters_and_needs_no_reference_copy():
    shape = ModelShape(P, P, 2, ARCH, lora_params_per_rank=ARCH.lora_params_per_rank)
    adapters = 8 * ARCH.lora_params_per_rank  # r (in + out) over q/k/v/o of every layer
    lora = plan_memory(inputs(model=shape.with_lora(8), max_open_groups=1, max_held_trajectories=0))
    assert lora.row("group sums").device == 2 * adapters * 4  # fp32 sums of bf16 adapters
    assert lora.row("optimizer state").device == 2 * adapters * 2
    assert lora.row("weights").device == (P + adapters) * 2
    full = plan_memory(inputs(model=shape, reference=True))
    assert full.row("reference copy").device == P * 2


def test_a_cpu_plan_is_checked_against_the_host_alone():
    plan = plan_memory(inputs(accelerator="cpu", max_open_groups=1))
    total = plan.device_bytes
    assert plan.fits(device_bytes=0, host_bytes=total).fits
    assert not plan.fits(device_bytes=10 * total, host_bytes=total - 1).fits


def test_a_colocated_engine_share_is_taken_off_the_device():
    plan = plan_memory(inputs(max_open_groups=1, engine_device_fraction=0.5))
    assert plan.fits(2 * plan.device_bytes, 0).fits
    assert not plan.fits(2 * plan.device_bytes - 2, 0).fits


def test_a_plan_that_does_not_fit_names_settings_and_each_named_setting_fits():
    i = inputs(max_batch_trajectories=1)
    plan = plan_memory(i)
    device = plan_memory(replace(i, max_open_groups=2)).device_bytes  # room for 2 open groups only
    verdict = plan.fits(device, 0)
    assert not verdict.fits
    assert "trainer.strategy.init_args.max_open_groups=2" in verdict.suggestions
    assert "trainer.strategy.init_args.offload=pinned" not in verdict.suggestions  # host 0: pinned cannot fit
    for s in verdict.suggestions:
        key, value = s.split(" ")[0].rsplit(".", 1)[1].split("=")
        if key in ("max_open_groups", "max_held_trajectories", "max_batch_trajectories"):
            assert plan_memory(replace(i, **{key: int(value)})).fits(device, 0).fits, s
    assert "max_open_groups=2" in verdict.message()


def test_lora_and_sharding_are_suggested_when_the_weights_state_does_not_fit():
    shape = ModelShape(P, P, 2, ARCH, lora_params_per_rank=ARCH.lora_params_per_rank)
    i = inputs(model=shape, max_open_groups=1, max_held_trajectories=1, max_batch_trajectories=1)
    plan = plan_memory(i)
    verdict = plan.fits(plan.device_bytes - plan.row("optimizer state").device // 8, 0)
    assert "model.lora.r=8 (LoRA: only adapters train)" in verdict.suggestions
    # over 2 ranks ZeRO-1 saves half the state (2P bytes) and adds the flat all-reduce (2P): 4 are needed
    assert "trainer.strategy.init_args.sharding=zero1 over 4 GPUs (trainer.devices=4)" in verdict.suggestions


def test_invalid_inputs_are_reported_together():
    with pytest.raises(
        ConfigError, match=r"sharding='zero3'.*offload='pinned' needs a GPU.*max_open_groups must"
    ):
        inputs(sharding="zero3", accelerator="cpu", offload="pinned", max_open_groups=0)


@pytest.mark.parametrize(
    "text, expected",
    [("80GB", 80 * 10**9), ("80GiB", 80 * 2**30), ("512 MiB", 512 * 2**20), ("1.5TB", 1.5e12), ("42", 42)],
)
def test_sizes_read_decimal_and_binary_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["eighty gigs", "GB", "1.5.2GB", "80 GBs", True, 2.5, None])
def test_an_unreadable_size_is_a_config_error(text):
    with pytest.raises(ConfigError, match="80GB, 80GiB"):
        parse_bytes(text)


@pytest.mark.parametrize("text", ["-5GB", -1, "1e400GB", "1e400"])
def test_a_negative_or_infinite_size_is_a_config_error(text):
    with pytest.raises(ConfigError, match="finite number of bytes >= 0"):
        parse_bytes(text)


def test_the_architecture_is_read_from_a_hugging_face_config_mapping():
    arch = Architecture.of(
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "vocab_size": 100,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "intermediate_size": 128,
        }
    )
    assert (arch.q_dim, arch.kv_dim, arch.intermediate) == (64, 32, 128)
    assert Architecture.of({"hidden_size": 64}) is None


def test_a_split_backward_call_holds_one_gradient_per_destination_up_to_its_cap():
    def backward(**kw) -> int:
        return next(r.device for r in plan_memory(inputs(**kw)).rows if r.name == "backward")

    assert backward(call_destinations=0) == 4 * P  # no split: one autograd result
    assert backward(call_destinations=100) == (4 + 1) * 4 * P  # max_batch_trajectories 4, plus the R terms'
    assert backward(call_destinations=3) == 3 * 4 * P  # the bytes cap
    assert backward(call_destinations=100, mode="sync") == 4 * P  # sync never splits
    assert backward(call_destinations=100, groups_per_step=1, max_batch_trajectories=32) == (4 + 1) * 4 * P
    from thundersync_lightning.planning.memory_fit import suggestions

    split = inputs(call_destinations=100, max_open_groups=1, max_held_trajectories=0)
    need = plan_memory(split).device_bytes
    assert any("split_backward=false" in s for s in suggestions(split, need - 1, 10**12, plan_memory))


def test_a_token_cap_bounds_a_calls_padded_tokens_by_the_scorers_padding_rule():
    per_token = plan_memory(inputs(max_batch_trajectories=1)).row("activations").device // 64
    plain = plan_memory(inputs(max_batch_trajectories=8))  # 8 rows x 64 tokens
    assert plain.row("activations").device == 8 * 64 * per_token
    # (1 + 0.25) x 128 real tokens + 2 x (8 // 2) shared forwards' fixed padding = 168 < 512
    capped = plan_memory(
        inputs(max_batch_trajectories=8, max_batch_tokens=128, score_max_padding=0.25, score_forward_tokens=2)
    )
    assert capped.row("activations").device == 168 * per_token
    assert "max_batch_tokens=128" in capped.row("activations").note
    # a cap under one trajectory still lets that trajectory through alone, unpadded: T = 64 tokens
    alone = plan_memory(inputs(max_batch_trajectories=8, max_batch_tokens=10, score_max_padding=0.0))
    assert alone.row("activations").device == 64 * per_token
    assert "at most one 64-token trajectory" in alone.row("activations").note
    # several rows under a cap just below T pad past T: (1 + 0.25) x 60 = 75 > 64
    several = plan_memory(inputs(max_batch_trajectories=8, max_batch_tokens=60, score_max_padding=0.25))
    assert several.row("activations").device == 75 * per_token
    # a loose cap never plans more than the rows allow, and an unknown padding rule bounds nothing
    loose = inputs(max_batch_trajectories=8, max_batch_tokens=10_000, score_max_padding=0.25)
    assert plan_memory(loose).row("activations").device == 8 * 64 * per_token
    unknown = plan_memory(inputs(max_batch_trajectories=8, max_batch_tokens=128))
    assert unknown.row("activations").device == 8 * 64 * per_token
    assert "padding is unknown" in unknown.row("activations").note


def test_a_plan_whose_activations_do_not_fit_suggests_the_largest_token_cap_that_fits():
    i = inputs(
        max_batch_trajectories=16,
        max_open_groups=1,
        max_held_trajectories=0,
        score_max_padding=0.25,
        score_forward_tokens=0,
    )
    plan = plan_memory(i)
    per_token = plan.row("activations").device // (16 * 64)
    room = plan.device_bytes - plan.row("activations").device + 700 * per_token  # 700 padded tokens
    verdict = plan.fits(room, 0)
    assert not verdict.fits
    # (1 + 0.25) B <= 700: B = 560, rounded down to 512
    assert "trainer.strategy.init_args.max_batch_tokens=512" in verdict.suggestions
    assert plan_memory(replace(i, max_batch_tokens=512)).fits(room, 0).fits
    assert not plan_memory(replace(i, max_batch_tokens=600)).fits(room, 0).fits
    blind = replace(i, score_max_padding=None)  # the cap bounds nothing the plan can see
    assert not any("max_batch_tokens" in s for s in plan_memory(blind).fits(room, 0).suggestions)


def test_token_cap_and_padding_inputs_are_validated():
    with pytest.raises(
        ConfigError,
        match=r"max_batch_tokens must be >= 1 or None.*score_max_padding must.*"
        r"score_forward_tokens must",
    ):
        inputs(max_batch_tokens=0, score_max_padding=-1.0, score_forward_tokens=-1)


def test_extra_buffers_per_open_group_are_planned_in_streaming_only():
    plan = plan_memory(inputs(max_open_groups=2, max_held_trajectories=3, group_extra_buffers=3))
    assert plan.row("group sums").device == (2 + 3) * 2 * 4 * P  # dynamic sampling's R sum + flagged sums
    assert "(4 sums + 3 x 2 open groups)" in plan.table()
    assert plan_memory(inputs(mode="sync", group_extra_buffers=3)).row("group sums").total == 0


def test_a_bucketed_vllm_publish_adds_its_buckets_and_a_tensor_larger_than_a_bucket_counts_whole():
    # ARCH: the largest tensor is the 128 x 64 MLP matrix (I > V), 4 bytes a weight: 32768 B
    rows = {
        r.name: r.device
        for r in plan_memory(inputs(weight_sync_buckets=2, weight_sync_bucket_bytes=1 << 20)).rows
    }
    assert rows["weight sync"] == 2 * (1 << 20)  # ipc: the learner's bucket and the engine's copy
    rows = {
        r.name: r.device
        for r in plan_memory(inputs(weight_sync_buckets=1, weight_sync_bucket_bytes=1024)).rows
    }
    assert rows["weight sync"] == 128 * 64 * 4  # nccl: one bucket, as large as the largest tensor
    assert "weight sync" not in {r.name for r in plan_memory(inputs()).rows}


def test_the_fit_plan_counts_weight_sync_buckets_from_the_vllm_settings():
    from thundersync_lightning.rollout import EmbeddedEngineConfig, VLLMEngineConfig

    def buckets(**kw):
        return VLLMEngineConfig(**kw).footprint.weight_sync_buckets

    assert buckets(weight_sync="ipc", multiprocessing=True) == 2
    assert buckets(weight_sync="nccl", multiprocessing=True) == 1
    assert buckets(weight_sync="file", multiprocessing=True) == 0
    assert buckets(weight_sync="auto", multiprocessing=False) == 0  # direct
    assert buckets(weight_sync="auto", multiprocessing=True, tensor_parallel_size=1) == 2
    assert buckets(weight_sync="auto", multiprocessing=True, tensor_parallel_size=2) == 1
    assert EmbeddedEngineConfig().footprint.weight_sync_buckets == 0  # not a vLLM engine


def test_vllm_servers_on_other_machines_leave_the_learner_only_its_share_and_one_send_bucket():
    from thundersync_lightning.core.grpo.objective import Objective
    from thundersync_lightning.planning.model_shape import ModelShape
    from thundersync_lightning.rollout import VLLMServerEngineConfig
    from thundersync_lightning.strategy.memory_check import plan_inputs

    engine = VLLMServerEngineConfig(urls=["http://10.0.0.2:8000"], weight_sync_bucket_bytes=1024).footprint
    planned = plan_inputs(
        model=ModelShape(P, P, 2, ARCH), objective=Objective(), accelerator="gpu", world_size=1,
        strategy={}, data={}, engine=engine,
    )  # fmt: skip
    assert planned.engine_device_fraction == 0 and planned.engine_device_bytes == 0  # no colocated engine
    assert planned.weight_sync_buckets == 1 and planned.weight_sync_bucket_bytes == 1024


def test_lora_on_the_attention_saves_no_down_proj_input_and_lora_on_down_proj_does():
    # a frozen linear's backward needs only its weight: down_proj's input (the SwiGLU product, e I
    # per token per layer) is saved only when down_proj trains
    shape = ModelShape(P, P, 2, ARCH, lora_params_per_rank=ARCH.lora_params_per_rank)
    full, lora = plan_memory(inputs(model=shape)), plan_memory(inputs(model=shape.with_lora(8)))
    saved = full.row("activations").device - lora.row("activations").device
    assert saved == 4 * 64 * ARCH.layers * 2 * ARCH.intermediate  # 4 trajectories x 64 tokens x L e I
    on_down_proj = plan_memory(inputs(model=shape.with_lora(8, frozen_down_proj=False)))
    assert on_down_proj.row("activations").device == full.row("activations").device


def test_the_model_shape_of_a_lora_config_knows_whether_down_proj_trains():
    from thundersync_lightning.core.types import ModelSpec
    from thundersync_lightning.modules.lora import LoraSettings
    from thundersync_lightning.modules.shape import model_shape

    spec = ModelSpec(model_type="qwen3", config={"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
                                                 "num_hidden_layers": 1, "num_attention_heads": 2,
                                                 "num_key_value_heads": 1, "head_dim": 8})  # fmt: skip
    assert model_shape(spec, LoraSettings(r=4)).frozen_down_proj
    assert not model_shape(spec, LoraSettings(r=4, target_modules=("q_proj", "down_proj"))).frozen_down_proj
    assert not model_shape(spec).frozen_down_proj  # full fine-tune


def test_auto_batch_trajectories_takes_the_whole_step_where_it_fits_else_the_largest_call_that_does():
    from thundersync_lightning.planning.memory_plan import auto_batch_trajectories

    i = inputs(world_size=2)  # 8 groups of 4 over 2 ranks: 16 trajectories of a step on a rank
    whole = plan_memory(replace(i, max_batch_trajectories=16)).device_bytes
    assert auto_batch_trajectories(i, whole, whole) == 16  # the step is one call
    assert auto_batch_trajectories(i, 10 * whole, 10 * whole) == 16  # never more rows than a step has
    for n in (1, 5, 9):  # a machine with exactly the room of n rows: n, and n + 1 does not fit
        room = plan_memory(replace(i, max_batch_trajectories=n)).device_bytes
        assert auto_batch_trajectories(i, room, room) == n
        assert not plan_memory(replace(i, max_batch_trajectories=n + 1)).fits_bytes(room, room)
    # nothing fits: one row (the set-up check then names what would); a plan that is only a worst
    # case (trajectories bounded by the context window alone) keeps the former fixed default
    assert auto_batch_trajectories(i, 1, 1) == 1
    worst = inputs(tokens_bounded=False, groups_per_step=16, group_size=8)  # 128 trajectories
    assert auto_batch_trajectories(worst, 1, 1) == 32
    assert auto_batch_trajectories(replace(worst, group_size=2), 1, 1) == 32
    assert auto_batch_trajectories(replace(worst, groups_per_step=2, group_size=4), 1, 1) == 8
    unknown = inputs(model=ModelShape(P, P, 4, None), groups_per_step=64)  # no activation rows: 32
    assert auto_batch_trajectories(unknown, 10**15, 10**15) == 32
