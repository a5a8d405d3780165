"""The split backward: one backward for every destination of a learner call, split by row.

- :mod:`.backward`: the recorded forward (:class:`RowCapture`) and the split of one backward
  into each destination's gradient (:func:`split_gradients`);
- :mod:`.row_grads`: each parameterised module's gradient from its own rows;
- :mod:`.factors`: a destination kept as factors until its coefficient is known (:class:`Chunk`);
- :mod:`.backend`: all of it as a backward backend (:class:`SplitBackend`);
- :mod:`.choice`: which fits use it (``split_backward="auto" | True | False``).
"""

from .backend import CALL_GRADIENT_BYTES, SplitBackend, max_destinations
from .backward import RowCapture, split_gradients, unsupported_modules
from .choice import (
    AUTO_MAX_PARAMS,
    SplitSetting,
    auto_splits,
    choose_backend,
    planned_destinations,
    split_problems,
)
from .factors import Chunk

__all__ = [
    "SplitBackend",
    "SplitSetting",
    "choose_backend",
    "split_problems",
    "planned_destinations",
    "auto_splits",
    "max_destinations",
    "AUTO_MAX_PARAMS",
    "CALL_GRADIENT_BYTES",
    "RowCapture",
    "split_gradients",
    "unsupported_modules",
    "Chunk",
]
