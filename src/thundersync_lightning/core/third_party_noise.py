"""Third-party messages that say nothing to a user of this package, filtered where they arise.

Each entry names the library, the message and why it carries no information here; everything else
(Lightning's device banner, its "max_steps reached", W&B's run folder and sync hint) stays. Installed
once by ``import thundersync_lightning`` (:func:`quiet_third_party`); ``THUNDERSYNC_NOISE=1`` keeps them.

- Lightning 2.6 + torch 2.13: "`isinstance(treespec, LeafSpec)` is deprecated" (Lightning's own
  pytree helper, once per fit: nothing a user can change);
- Lightning: "Total length of `list` across ranks is zero" (a run without held-out tasks has an
  empty validation loader on purpose);
- Lightning: the "Tip: ... litlogger" advertisement logged by every Trainer.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["quiet_third_party", "NOISY_WARNINGS", "NOISY_LOGS"]

#: Regular expressions of warning messages dropped (matched at the start of the message).
NOISY_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"Total length of `\w+` across ranks is zero",
)
#: (logger name, substring) of log records dropped.
NOISY_LOGS = (("lightning.pytorch.utilities.rank_zero", "litlogger"),)


class _DropRecords(logging.Filter):
    def __init__(self, needles: tuple[str, ...]) -> None:
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(n in message for n in self.needles)


_installed = False


def quiet_third_party() -> None:
    """Install the filters (idempotent); nothing when ``THUNDERSYNC_NOISE`` is set to 1."""
    global _installed
    if _installed or os.environ.get("THUNDERSYNC_NOISE", "").strip() in ("1", "true", "yes"):
        return
    _installed = True
    for pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    by_logger: dict[str, tuple[str, ...]] = {}
    for name, needle in NOISY_LOGS:
        by_logger[name] = (*by_logger.get(name, ()), needle)
    for name, needles in by_logger.items():
        logging.getLogger(name).addFilter(_DropRecords(needles))
