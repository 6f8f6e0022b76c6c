"""Errors that mean the input itself is unusable: one line for the user, exit code 2, no traceback."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: the message says what is wrong, where, and what to do."""

    exit_code = 2


class NotApplicable(Exception):
    """This input is not one the step handles (a set-up for another kind of model): the step's checks, and those
    of the steps that need it, say `skip` with the message as the reason. Raised by a step, never a usage error."""

    def __init__(self, message: str, title: str | None = None) -> None:
        super().__init__(message)
        self.title = title or message
