"""The user-facing errors: the CLI prints each as one line and exits with its code; :func:`shown` quotes
a value from a file or request in such a line."""

import reprlib
from itertools import islice


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
    """reprlib's shortened repr, also for what reprlib would hand to ``repr`` whole: subclasses of the
    containers (an OrderedDict nested 200,000 deep), bytes, and integers too long for ``str`` (Python
    refuses more than 4,300 digits, and takes time quadratic in the digits below that)."""

    def repr1(self, x, level):
        if isinstance(x, bool) or x is None or isinstance(x, float):
            return repr(x)
        if isinstance(x, int):
            bits = x.bit_length()
            return f"<an integer of {bits} bits>" if bits > 256 else super().repr_int(int(x), level)
        if isinstance(x, str):
            return super().repr_str(str(x), level)
        if isinstance(x, (bytes, bytearray)):
            return repr(bytes(x[: self.maxstring])) + ("..." if len(x) > self.maxstring else "")
        if isinstance(x, dict):
            if level <= 0:
                return "{...}"
            items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                     for k, v in islice(x.items(), self.maxdict)]
            return "{" + ", ".join(items) + (", ..." if len(x) > self.maxdict else "") + "}"
        if isinstance(x, list):
            return super().repr_list(list(islice(x, self.maxlist + 1)), level)
        if isinstance(x, tuple):
            return super().repr_tuple(tuple(islice(x, self.maxtuple + 1)), level)
        return super().repr1(x, level)


_SHOWN = _Shown()
_SHOWN.maxstring = _SHOWN.maxother = 60


def shown(value) -> str:
    """``value`` as an error message quotes it: its repr, shortened (:mod:`reprlib`), whatever its size or
    depth, so that a value from a stranger's file (a config value of 10**6000, a list nested 200,000 deep)
    makes one short line."""
    return _SHOWN.repr(value)


def counted(n: int, noun: str, plural: str | None = None, spec: str = "") -> str:
    """``n`` and its noun, singular for 1: ``counted(1, "line")`` is ``1 line``, ``counted(3, "line")`` ``3 lines``
    (``plural`` where adding an s is wrong: ``counted(2, "entry", "entries")``; ``spec`` formats the number:
    ``counted(12000, "pair", spec=",")`` is ``12,000 pairs``)."""
    return f"{n:{spec}} {noun if n == 1 else plural or noun + 's'}"
