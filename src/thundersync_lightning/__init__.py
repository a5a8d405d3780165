"""thundersync-lightning: streaming, zero-staleness GRPO for LLM agents as a Lightning strategy.

Importing the package registers ``Trainer(strategy="thundersync")``. The core
(``thundersync_lightning.core``) is pure torch and stays usable where Lightning is absent.
"""

__version__ = "0.1.0"

try:
    from lightning.pytorch.strategies import StrategyRegistry
except ImportError:  # core-only use: no Lightning installed
    __all__ = ["__version__"]
else:
    from .strategy import ThunderSyncStrategy

    ThunderSyncStrategy.register_strategies(StrategyRegistry)
    __all__ = ["ThunderSyncStrategy", "__version__"]
