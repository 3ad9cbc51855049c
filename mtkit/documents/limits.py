"""What a document from elsewhere may cost (the size of the file, what its archive may inflate to): one object,
read by the archive reader, the format modules, the CLI and the server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What a document from elsewhere may cost: its size on disk, and what its archive may inflate to."""

    max_bytes: int = 256 << 20  # the file itself
    max_entries: int = 10_000  # entries of an archive (.docx, .pptx, .odt, .epub)
    max_inflated: int = 1 << 30  # all entries together, inflated
    max_entry: int = 256 << 20  # one entry, inflated
    max_ratio: int = 200  # inflated / compressed, for an entry past 1 MiB inflated (a zip bomb's is ~1000)
