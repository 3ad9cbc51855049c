"""Plain text (.txt): each line translated, empty lines and line endings (``\\n``, ``\\r\\n``) and a UTF-8 byte
order mark kept."""

from __future__ import annotations

from mtkit.documents import Limits, Texts
from mtkit.errors import MtkitError


def decode_text(data: bytes, name: str) -> tuple[str, str]:
    """``data`` as text and its byte order mark (``""`` or ``"\\ufeff"``); one line naming the first undecodable
    line otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise MtkitError(f"{name}: line {line}: not valid UTF-8 (byte {e.start:,})") from None
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    return text[len(bom):], bom


def translate(data: bytes, fmt: str, texts: Texts, name: str, limits: Limits) -> bytes:
    text, bom = decode_text(data, name)
    lines = text.splitlines(keepends=True)
    bodies = [line.rstrip("\r\n") for line in lines]
    todo = [i for i, b in enumerate(bodies) if b.strip()]
    done = texts.plain([bodies[i] for i in todo], name)
    for i, t in zip(todo, done, strict=True):
        lines[i] = t + lines[i][len(bodies[i]):]
    return (bom + "".join(lines)).encode("utf-8")
