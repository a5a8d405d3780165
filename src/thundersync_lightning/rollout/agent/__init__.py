"""The multi-turn agent loop (:mod:`.loop`), the environment pool it calls (:mod:`.env_pool`) and
the gate that keeps a task's verdicts and its acting episodes apart (:mod:`.group_gate`), and the order of
rollouts against publishes for an engine built on the loop (:mod:`.issue_order`). Independent of how tokens
are generated: both engines drive it."""

__all__: list[str] = []  # its public names are exported once, by thundersync_lightning.rollout
