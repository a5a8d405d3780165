"""thundersync-lightning."""
