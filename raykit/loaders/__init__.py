"""raykit.loaders."""
