"""The user-facing errors: the CLI prints each as one line and exits with its code."""


class MtkitError(Exception):
    """An error caused by the user's input (a file, a key, a value), not by a bug.

    The message must be one line and name what is wrong and where
    (file and line, or dotted config key). The CLI exits with ``exit_code``.
    """

    exit_code = 1


class Interrupted(MtkitError):
    """A signal (SIGINT, SIGTERM) ended the command after it saved what it had; exit 128 + signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum
