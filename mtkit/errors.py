"""The user-facing errors: the CLI prints each as one line and exits with its code."""

import reprlib


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


class _Shown(reprlib.Repr):
    """reprlib's bounded repr (a few items per level, a few levels), and an integer too long for
    ``repr`` (Python refuses more than 4300 digits) by its size."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 80
        self.maxlong = 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 1000:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHOWN = _Shown()


def shown(value: object) -> str:
    """``repr(value)`` bounded in length, depth and digits: how a message quotes a value that came
    from a file or a request (a list nested 200,000 deep, an integer of 10,000 digits)."""
    return _SHOWN.repr(value)
