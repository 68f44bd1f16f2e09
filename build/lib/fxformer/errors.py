"""Errors a user can fix, reported by every command as one sentence (exit status 2), never a traceback.

Imports nothing, so any module can raise them without pulling in the command line.
"""


class UserError(Exception):
    """A mistake the user can fix; reported as one sentence, without a traceback."""
