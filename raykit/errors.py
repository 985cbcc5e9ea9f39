"""raykit's single error hierarchy.

Every error a caller can trigger derives from :class:`RaykitError` and from the builtin that best
describes it, so ``except FileNotFoundError`` and ``except RaykitError`` both work.
"""

from __future__ import annotations

__all__ = [
    "CameraError",
    "ConfigError",
    "ExportError",
    "RangeIgnoredWarning",
    "RayRangeError",
    "RaykitError",
    "RaykitWarning",
    "ResumeError",
    "SourceError",
    "StaleLockWarning",
    "StoreChangedError",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreVersionError",
    "WorkerError",
]


class RaykitError(Exception):
    """Root of every error raised by raykit on purpose."""


class RaykitWarning(UserWarning):
    """Something raykit assumed or skipped that the user should know about (a default used, a file
    ignored); the CLI prints each as one ``raykit: warning:`` line."""


class CameraError(RaykitError, ValueError):
    """An invalid camera record: unknown model, wrong parameter count, bad focal length, NaN/inf."""


class ConfigError(RaykitError, ValueError):
    """An invalid option or combination of options."""


class StoreError(RaykitError):
    """Any problem with a ray store."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The store, its manifest or one of its payload files does not exist."""


class StoreCorruptError(StoreError, OSError):
    """A payload file fails its checksum, is truncated, or contradicts the manifest."""


class StoreVersionError(StoreError, ValueError):
    """The store was written by a newer (or unknown) format version."""


class ExportError(RaykitError, OSError):
    """A model export that cannot be written or read: missing, corrupt (checksum), or of a newer format."""


class ResumeError(RaykitError, ValueError):
    """A checkpoint or loader state cannot be resumed here (different store, incompatible settings)."""


class SourceError(RaykitError, ValueError):
    """A capture that cannot be converted. ``problems`` lists every problem found, one line each."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class WorkerError(RaykitError, RuntimeError):
    """A loader worker process died (killed, crashed, out of memory) while the loader needed it."""


class StoreLockedError(StoreError, RuntimeError):
    """Another process (named in the message) is writing this store, or left a stale lock."""


class StoreChangedError(StoreError, RuntimeError):
    """The store was replaced (e.g. ``convert --overwrite``) while it was being read."""


class RayRangeError(StoreError, IndexError):
    """A split, chunk, ray range or image that the store does not have."""


class RangeIgnoredWarning(RaykitWarning):
    """A server answered a range request with the whole file (reads fall back to whole files)."""


class StaleLockWarning(RaykitWarning):
    """A lock left by a writer that no longer runs was taken over (``raykit.locks``)."""
