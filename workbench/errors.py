"""Errors that mean the input itself is unusable: one line for the user, exit code 2, no traceback."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: the message says what is wrong, where, and what to do."""

    exit_code = 2
