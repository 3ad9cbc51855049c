"""``mtkit ARGS`` run inside the test process: the CLI's own entry point (:func:`mtkit.cli.main`, what
``python -m mtkit`` and the ``mtkit`` script call), with its arguments, standard streams, exit code and
error lines as a process would have them, but without a fresh Python (~2-3 s of imports per call).

For the tests whose subject is what a command does (its outputs, files, messages and exit codes); the
tests whose subject is the process itself (signals, pipes read as they come, ``| head``, torchrun, a
server, what an import loads) start a real one.

What a call changes in this process is put back afterwards: ``sys.argv``, the environment, the working
directory, torch's thread count, the random generators and the ``mtkit`` logger's handlers (the CLI
installs its stderr handler; left in place it would write the library's messages into later tests).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from click.testing import CliRunner

# What the tests' subprocesses ran with: no traceback unless asked (``--debug``).
ENV = {"MTKIT_DEBUG": ""}


@contextlib.contextmanager
def _kept_process_state(cwd: Path | None, env: dict | None) -> Iterator[None]:
    logger = logging.getLogger("mtkit")
    handlers, level = list(logger.handlers), logger.level
    argv, environ, here = sys.argv, dict(os.environ), os.getcwd()
    threads = torch.get_num_threads()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        os.environ.update({**ENV, **(env or {})})
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = argv
        logger.handlers[:] = handlers
        logger.setLevel(level)
        torch.set_num_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)


def run_mtkit(*args, stdin: str | None = None, cwd: Path | None = None,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """``mtkit ARGS`` with ``stdin`` (text; empty when None) as standard input -> its exit code, stdout and
    stderr, as :func:`subprocess.run` (``capture_output=True, text=True``) would give them.

    ``env``: variables set for the call (on top of the process's own, and ``MTKIT_DEBUG`` cleared).
    An exception that escapes ``main`` (``--debug``) is printed with its traceback and gives 1, as
    Python does when a program ends on one.
    """
    from mtkit.cli import main

    argv = [str(a) for a in args]
    code: int = 0
    with _kept_process_state(cwd, env), CliRunner().isolation(input=stdin or "") as (out, err, _):
        sys.argv = ["mtkit", *argv]
        # Warnings go to stderr as a process prints them (pytest would collect them), and deprecations are
        # not shown, as in a process (pytest shows them always).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
            warnings.showwarning = _print_warning
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001  (what Python does with an exception a program ends on)
                traceback.print_exc(file=sys.stderr)
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode("utf-8", "backslashreplace")
    return subprocess.CompletedProcess(["mtkit", *argv], code, stdout, stderr)
