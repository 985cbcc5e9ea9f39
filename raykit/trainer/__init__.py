"""raykit.trainer."""
