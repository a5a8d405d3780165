"""thundersync_lightning.callbacks."""
