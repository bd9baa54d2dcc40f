"""Errors that end a run with one clear line: the user's input or setup is wrong.

A candidate's own failure is never an exception; it is a status with a reason on the record.
"""


class KminerError(Exception):
    """A problem the user can fix; the CLI prints it as one red line and exits non-zero."""


class BadInput(KminerError):
    """The repository argument, ref or workdir cannot be used."""


class SetupError(KminerError):
    """A tool kminer needs (nvcc, git, a grammar) is missing or broken."""
