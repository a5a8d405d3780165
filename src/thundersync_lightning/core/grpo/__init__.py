"""The GRPO math: the objective (:mod:`.objective`), advantage estimators (:mod:`.estimators`),
the per-token terms (:mod:`.terms`), rollout rejection (:mod:`.rejection`) and dynamic sampling's
group filter (:mod:`.group_filter`). Pure functions and frozen configs; no gradient state."""

__all__: list[str] = []  # its public names are exported once, by thundersync_lightning.core
