"""thundersync_lightning.rollout."""
