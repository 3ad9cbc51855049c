"""(Placeholder until the integrity guard's text side lands: numbers as written, nothing else.)"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,:]\d+)*(?![\w])")


@dataclass(frozen=True)
class Protected:
    text: str
    kind: str
    renderings: tuple[str, ...]


def protected_tokens(source: str, src_lang: str | None = None, tgt_lang: str | None = None) -> list[Protected]:
    return [Protected(m.group(0), "number", (m.group(0),)) for m in _NUMBER.finditer(source)][:64]


def missing(tokens: list[Protected], translation: str) -> list[Protected]:
    have = Counter(m.group(0) for m in _NUMBER.finditer(translation))
    out = []
    for p in tokens:
        if have[p.text] > 0:
            have[p.text] -= 1
        else:
            out.append(p)
    return out


def looping(translation: str, source: str) -> bool:
    words = translation.split()
    return any(len(set(words[i:i + 4])) == 1 for i in range(max(0, len(words) - 3)))
