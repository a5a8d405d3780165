"""Gradient storage: where the accumulator's buffers live and their byte accounting
(:mod:`.storage`), overlapped device-to-host copies (:mod:`.copies`), a backend's deferred form of
a gradient (:mod:`.deferred`) and the backward backend protocol with its plain backend
(:mod:`.backward`)."""

__all__: list[str] = []  # its public names are exported once, by thundersync_lightning.core
