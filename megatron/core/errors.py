"""Errors a user causes (bad flags, data, tokenizer files or checkpoints), in one place.

Each is a MegatronUserError, so an entry point catches that one base and prints its message as
one line (exit code 2) instead of a traceback. A message names the flag or file and the fix.
This module imports nothing, so every other module can import it without a cycle.
"""


class MegatronUserError(ValueError):
    """Bad input from the user; the message names the flag or file and how to fix it."""


class ConfigError(MegatronUserError):
    """Invalid configuration; the message names the flag(s) and how to fix it."""


class ParallelConfigError(ConfigError):
    """A parallel layout that cannot be built; the message names the flags and the fix."""


class DatasetError(MegatronUserError):
    """Data files that cannot be used; the message names the file, the problem and the fix."""


class TokenizerError(MegatronUserError):
    """A tokenizer cannot be built from the given files; the message says which and why."""


class CheckpointError(MegatronUserError):
    """A checkpoint that cannot be used; the message names the file or tensor and why."""


class ScheduleError(MegatronUserError):
    """A pipeline schedule asked for a (P, M, V) it cannot run."""
