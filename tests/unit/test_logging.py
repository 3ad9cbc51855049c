"""One logger: the library says what it says through ``logging.getLogger("mtkit…")`` and installs no handler;
the CLI (and so the server, and every process mtkit starts, each a ``python -m mtkit``) puts the one stderr
handler in place (:func:`mtkit.logs.to_stderr`)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
from conftest import write_tiny_checkpoint

import mtkit
from mtkit.logs import LOGGER, to_stderr

PACKAGE = Path(mtkit.__file__).parent
SPEAKERS = {"cli.py", "logs.py"}  # besides commands/: the modules that may write on stderr themselves


def library_modules() -> list[Path]:
    """mtkit's modules but the CLI and its commands."""
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] != "commands" and path.name != "cli.py"]


def _is_stderr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "stderr" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def test_no_library_function_takes_a_log_parameter_or_prints_on_stderr():
    found = []
    for path in library_modules():
        where = path.relative_to(PACKAGE)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None]
                if "log" in names:
                    found.append(f"{where}:{node.lineno}: a parameter named log")
            if isinstance(node, ast.Call) and path.name not in SPEAKERS:
                func = node.func
                if (isinstance(func, ast.Name) and func.id == "print"
                        and any(k.arg == "file" and _is_stderr(k.value) for k in node.keywords)):
                    found.append(f"{where}:{node.lineno}: print(..., file=sys.stderr)")
                if isinstance(func, ast.Attribute) and func.attr == "write" and _is_stderr(func.value):
                    found.append(f"{where}:{node.lineno}: sys.stderr.write")
                if (isinstance(func, ast.Attribute) and func.attr == "print_exception"
                        and any(k.arg == "file" and _is_stderr(k.value) for k in node.keywords)):
                    found.append(f"{where}:{node.lineno}: a traceback printed on stderr")
    assert not found, "\n".join(found)


@pytest.fixture
def bare_logger():
    """The ``mtkit`` logger as a program that imports mtkit has it: no handler, no level (restored after)."""
    logger = logging.getLogger(LOGGER)
    handlers, level = list(logger.handlers), logger.level
    logger.handlers[:] = []
    logger.setLevel(logging.NOTSET)
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_the_library_says_nothing_unless_asked_and_the_handler_says_it_on_stderr(tmp_path, capfd, bare_logger):
    path = write_tiny_checkpoint(tmp_path / "tiny.pt")
    mtkit.load(path, device="cpu", threads=1)
    assert capfd.readouterr() == ("", "")
    to_stderr()
    to_stderr()  # once, however often called
    mtkit.load(path, device="cpu", threads=1)
    out, err = capfd.readouterr()
    assert out == "" and err.splitlines() == [f"loaded {path} (step 1)", "threads: 1 (set by --threads)"]
