"""thundersync_lightning.strategy."""
