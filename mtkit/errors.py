"""The user-facing error: the CLI prints it as one line and exits 1."""


class MtkitError(Exception):
    """An error caused by the user's input (a file, a key, a value), not by a bug.

    The message must be one line and name what is wrong and where
    (file and line, or dotted config key).
    """
