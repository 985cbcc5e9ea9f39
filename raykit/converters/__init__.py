"""raykit.converters."""
