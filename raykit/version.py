"""raykit's version, in a module that imports nothing: the store's manifest, the CLI's ``--version``,
run records and the package metadata (pyproject.toml reads it from here) all take it from this one line."""

__version__ = "0.1.0"
