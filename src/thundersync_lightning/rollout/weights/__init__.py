"""Weights on their way to an engine: a state dict in shared memory, one buffer per dtype
(:mod:`.shared_memory`, the embedded engine), and transports without files, in bounded buckets
through shared device memory or a broadcast (:mod:`.transport`, the vLLM engine)."""

from .shared_memory import SharedWeights

__all__ = ["SharedWeights"]
