"""A deliberately wrong learner for ``verify``'s tests: its streaming gradient is off by 1% on
one parameter (a strategy subclass named by a config's ``class_path``)."""

from __future__ import annotations

from typing import Any

import torch

from thundersync_lightning.strategy import ThunderSyncStrategy


class SkewedStreamingStrategy(ThunderSyncStrategy):
    """Streaming multiplies the first trainable parameter's gradient by 1.01; sync is untouched."""

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = super().backward(closure_loss, optimizer, *args, **kwargs)
        if self.mode == "streaming":
            first = next(p for p in self.lightning_module.parameters() if p.requires_grad)
            first.grad.mul_(1.01)
        return out
