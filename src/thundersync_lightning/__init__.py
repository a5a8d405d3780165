"""thundersync-lightning: streaming, zero-staleness GRPO for LLM agents as a Lightning strategy.

Importing the package registers ``Trainer(strategy="thundersync")`` and filters a few third-party
messages that say nothing to its users (``core/third_party_noise.py``). The core
(``thundersync_lightning.core``) is pure torch and stays usable where Lightning is absent.
"""

import sys

from .core.moved_modules import install as _install_moved_modules

__version__ = "0.1.0"

# Processes started by multiprocessing's spawn (rollout engines, their workers) import this
# package only to reach their own module; importing Lightning there would add seconds to every
# engine start for a registration they never use. (The embedded engine's fork server imports it
# once and forks every engine from there, so the cost is not repeated per start.)
_SPAWNED_CHILD = "--multiprocessing-fork" in sys.argv

_install_moved_modules()  # old module paths answer for one release (core/moved_modules.py)

try:
    if _SPAWNED_CHILD:
        raise ImportError
    from lightning.pytorch.strategies import StrategyRegistry
except ImportError:  # core-only use (no Lightning installed) or a spawned helper process
    __all__ = ["__version__"]
else:
    from .core.third_party_noise import quiet_third_party
    from .strategy import ThunderSyncStrategy

    quiet_third_party()  # third-party messages that say nothing here (core/third_party_noise.py)

    ThunderSyncStrategy.register_strategies(StrategyRegistry)
    __all__ = ["ThunderSyncStrategy", "__version__"]
