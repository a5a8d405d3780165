"""Gradient clipping, LR schedulers and precision plugins act on the streamed gradient as in Lightning."""

from __future__ import annotations

import torch

from thundersync_lightning.modules import GRPOPolicy

from ._fit import TOY_MODEL, fit, flat


class _SGDPolicy(GRPOPolicy):
    """Plain SGD so a parameter change is lr x the (clipped) gradient, and an optional schedule."""

    def __init__(self, schedule=None, **kwargs):
        super().__init__(config=TOY_MODEL, **kwargs)
        self._schedule = schedule

    def configure_optimizers(self):
        optimizer = torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=1.0)
        if self._schedule is None:
            return optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self._schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _one_step_change(**trainer_kwargs) -> float:
    torch.manual_seed(0)
    policy = _SGDPolicy()
    before = flat(policy)
    after, steps, _ = fit("streaming", steps=1, policy=policy, **trainer_kwargs)
    assert steps[0].staleness_max == 0
    return float((after - before).norm())


def test_gradient_clipping_bounds_the_streamed_update():
    unclipped = _one_step_change()
    clipped = _one_step_change(gradient_clip_val=1e-3, gradient_clip_algorithm="norm")
    assert unclipped > 1e-2  # the toy step's gradient norm is far above the clip
    assert abs(clipped - 1e-3) < 1e-6  # SGD with lr 1: the update is exactly the clipped gradient


def test_a_step_lr_schedule_applies_between_rl_steps():
    torch.manual_seed(0)
    policy = _SGDPolicy(schedule=lambda step: 1.0 if step == 0 else 0.0)  # learn on the first step only
    before = flat(policy)
    after_two, steps, _ = fit("streaming", steps=2, policy=policy)
    torch.manual_seed(0)
    once = _SGDPolicy(schedule=lambda step: 1.0 if step == 0 else 0.0)
    after_one, _, _ = fit("streaming", steps=1, policy=once)
    assert len(steps) == 2
    assert float((after_two - before).norm()) > 1e-2  # the first step moved the weights
    # the second step's lr is 0: nothing more moves (up to event-order float noise between the runs)
    assert float((after_two - after_one).abs().max()) < 1e-5


def test_bf16_autocast_trains_with_zero_staleness():
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL)
    before = flat(policy)
    after, steps, trainer = fit("streaming", steps=2, policy=policy, precision="bf16-mixed")
    assert trainer.precision == "bf16-mixed"
    assert [s.staleness_max for s in steps] == [0, 0]
    assert torch.isfinite(after).all() and not torch.equal(after, before)
