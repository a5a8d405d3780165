"""The streaming accumulator: :class:`.streaming.StreamingGRPO` and its parts (a group's state,
routing of a call's rows to destinations, the backward jobs, the step's gradient, memory bounds,
boundary checks, the boundary cut and the report at the barrier)."""

__all__: list[str] = []  # its public names are exported once, by thundersync_lightning.core
