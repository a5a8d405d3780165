"""thundersync_lightning.envs."""
