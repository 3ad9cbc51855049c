"""mtkit's one logger: every module says what it says through ``logging.getLogger(__name__)`` (the
``mtkit`` logger's children); the library installs no handler, so a program that imports mtkit hears
nothing it did not ask for. The CLI and the server call :func:`to_stderr` once: each message, bare, as one
line on the standard error stream of the moment (so that a test's captured stderr gets it).
"""

from __future__ import annotations

import logging
import sys

LOGGER = "mtkit"


class _StderrHandler(logging.Handler):
    """A message a line on ``sys.stderr`` as it is when the message is said, flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001  (logging's rule: a handler never raises)
            self.handleError(record)


def to_stderr(level: int = logging.INFO) -> None:
    """Say the ``mtkit`` logger's messages (``level`` and above) on stderr, once however often called."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
