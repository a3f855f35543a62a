"""Errors that carry an exit code and a message for the user (what failed, why, what to do)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class DamonHpError(Exception):
    """A failure the user should read; `exit_code` follows the CLI's convention."""

    exit_code = EXIT_FAILURE


class EnvironmentProblem(DamonHpError):
    """The system cannot do what was asked (no DAMON, busy kdamond, not root, bad PID)."""

    exit_code = EXIT_USAGE
