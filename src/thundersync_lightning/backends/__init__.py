"""Opt-in backward backends (:class:`~thundersync_lightning.core.gradients.backward.BackwardBackend`).

The accumulator and the strategy's runner run every learner call's backward through one backend;
the default, :class:`~thundersync_lightning.core.gradients.backward.PlainBackward`, lives in the core. A
backend here changes what a call costs, never its gradient (each is tested against the plain
one), and imports nothing above the core. The strategy picks one:

- :mod:`~thundersync_lightning.backends.split`: one backward for every destination of a call,
  the parameter gradients split by row (``ThunderSyncStrategy(split_backward=...)``).
"""

from .split import SplitBackend, SplitSetting, choose_backend

__all__ = ["SplitBackend", "SplitSetting", "choose_backend"]
