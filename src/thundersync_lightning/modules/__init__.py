"""LightningModule and LightningDataModule for GRPO on rollouts."""

from .collect import CollectedBatch, collect_batch
from .data import EngineFactory, RolloutDataModule
from .lora import LoraSettings
from .policy import TINY_QWEN3, GRPOPolicy

__all__ = ["GRPOPolicy", "RolloutDataModule", "EngineFactory", "LoraSettings", "TINY_QWEN3", "collect_batch", "CollectedBatch"]
