"""The embedded engine: a frozen policy snapshot generating with Hugging Face models in its own
process (:mod:`.engine`, learner side; :mod:`.process`, the process and its channels;
:mod:`.worker`, the process's main; :mod:`.generator`, batched KV-cache generation)."""

from .engine import EmbeddedEngine

__all__ = ["EmbeddedEngine"]
