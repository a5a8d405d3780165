"""thundersync_lightning.core."""
