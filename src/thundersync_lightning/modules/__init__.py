"""LightningModule and LightningDataModule for GRPO on rollouts."""

from .collect import CollectedBatch, collect_batch
from .data import EngineFactory, RolloutDataModule  # noqa: F401 - the core's EngineFactory, importable here
from .lora import LoraSettings
from .policy import TINY_QWEN3, GRPOPolicy

__all__ = ["GRPOPolicy", "RolloutDataModule", "LoraSettings", "TINY_QWEN3", "collect_batch", "CollectedBatch"]
