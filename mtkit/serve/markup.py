"""``format: html``: translate an HTML fragment's text, keep its markup.

The fragment is cut at its tags and comments; each line of text between two tags (entities
decoded) is one sentence to translate, and the markup is rebuilt around the translations
(escaped again), with the whitespace around each line kept. The text of ``<script>`` and
``<style>`` is left alone. A sentence that spans tags (``a <b>bold</b> word``) is translated in
pieces, as LibreTranslate's own HTML mode does with its text nodes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

_TAGS = re.compile(r"(<!--.*?-->|<[^>]*>)", re.S)
_NAME = re.compile(r"<\s*(/?)\s*([A-Za-z][A-Za-z0-9-]*)")
_RAW = ("script", "style")


def split_markup(markup: str) -> tuple[list[str], Callable[[list[str]], str]]:
    """The sentences of ``markup`` to translate, and a function that rebuilds it from their translations."""
    template: list[str | int] = []
    sentences: list[str] = []
    raw: str | None = None  # inside <script> or <style>
    for i, part in enumerate(_TAGS.split(markup)):
        if i % 2:  # a tag or a comment
            template.append(part)
            m = _NAME.match(part)
            if m:
                closing, name = m.group(1), m.group(2).lower()
                if not closing and name in _RAW and not part.rstrip(">").rstrip().endswith("/"):
                    raw = name
                elif closing and name == raw:
                    raw = None
            continue
        if raw is not None or not part.strip():
            template.append(part)
            continue
        for k, line in enumerate(part.split("\n")):
            if k:
                template.append("\n")
            core = line.strip()
            if not core:
                template.append(line)
                continue
            template += [line[: len(line) - len(line.lstrip())], len(sentences), line[len(line.rstrip()):]]
            sentences.append(html.unescape(core))

    def rebuild(translations: list[str]) -> str:
        return "".join(html.escape(translations[p], quote=False) if isinstance(p, int) else p for p in template)

    return sentences, rebuild
