"""A document archive (.docx, .pptx, .odt, .epub: zip files) and its XML, read from a stranger at a cost bounded
by the file's size.

Before anything is inflated the central directory is checked: the number of entries, each entry's and the total
inflated size it claims, the ratio of inflated to compressed size (a zip bomb's is about 1000), names that leave
the folder (``../``, an absolute path, a drive) and names given twice. An entry is then inflated through a reader
that stops at the size it claimed (the claim itself is not trusted). Every XML part is vetted by defusedxml (no
DTD, so no entity expansion (billion laughs) and no external entity (XXE)) before a library parses it.

An archive is written back with its entries in their order and names, dates and compression, an unchanged one with
the same bytes (so the ODF/EPUB ``mimetype`` stays first and stored).
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from xml.etree.ElementTree import ParseError

import defusedxml
from defusedxml.ElementTree import fromstring
from lxml import etree

from mtkit.documents.limits import Limits
from mtkit.errors import MtkitError

_CHUNK = 1 << 16
_RATIO_FROM = 1 << 20  # entries smaller than this inflated may have any ratio (a run of XML spaces does)


@dataclass
class Entry:
    info: zipfile.ZipInfo
    data: bytes
    changed: bool = False


class Archive:
    """The entries of a zip document, in order, inflated (bounded); :meth:`xml` vets a part, :meth:`write` writes
    the archive back with the entries that were replaced."""

    def __init__(self, data: bytes, name: str, limits: Limits) -> None:
        self.name = name
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
            infos = zf.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as e:
            raise MtkitError(f"{name}: not a readable zip archive ({e})") from None
        if len(infos) > limits.max_entries:
            raise MtkitError(f"{name}: {len(infos):,} archive entries, more than the {limits.max_entries:,} allowed")
        seen: set[str] = set()
        total = 0
        for info in infos:
            entry = info.filename
            parts = entry.replace("\\", "/").split("/")
            if entry.startswith(("/", "\\")) or ".." in parts or (len(entry) > 1 and entry[1] == ":"):
                raise MtkitError(f"{name}: archive entry {entry!r} leaves the archive's folder")
            if entry in seen:
                raise MtkitError(f"{name}: archive entry {entry!r} is there twice")
            seen.add(entry)
            if info.file_size > limits.max_entry:
                raise MtkitError(f"{name}: archive entry {entry!r} inflates to {info.file_size:,} bytes, more than "
                                 f"the {limits.max_entry:,} allowed")
            if info.file_size > _RATIO_FROM and info.file_size > limits.max_ratio * max(1, info.compress_size):
                ratio = info.file_size // max(1, info.compress_size)
                raise MtkitError(f"{name}: archive entry {entry!r} inflates {ratio:,} times (a zip bomb?); at most "
                                 f"{limits.max_ratio} allowed")
            total += info.file_size
            if total > limits.max_inflated:
                raise MtkitError(f"{name}: the archive inflates to more than the {limits.max_inflated:,} bytes allowed")
        self.entries = {info.filename: Entry(info, self._inflate(zf, info)) for info in infos}

    def _inflate(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
        """An entry's bytes, reading no more than it claims (a lying header is an error, not a bomb)."""
        out = bytearray()
        try:
            with zf.open(info) as f:
                while chunk := f.read(_CHUNK):
                    out += chunk
                    if len(out) > info.file_size:
                        raise MtkitError(f"{self.name}: archive entry {info.filename!r} inflates past the "
                                         f"{info.file_size:,} bytes it claims")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError,
                RuntimeError) as e:  # RuntimeError: an encrypted entry
            raise MtkitError(f"{self.name}: archive entry {info.filename!r} cannot be read ({e})") from None
        except Exception as e:  # zlib.error and friends from a corrupt stream
            if isinstance(e, MtkitError):
                raise
            raise MtkitError(f"{self.name}: archive entry {info.filename!r} cannot be read ({e})") from None
        return bytes(out)

    def names(self) -> list[str]:
        return list(self.entries)

    def read(self, entry: str) -> bytes:
        return self.entries[entry].data

    def replace(self, entry: str, data: bytes) -> None:
        """Put ``data`` in place of ``entry`` (kept in its place, with its compression)."""
        found = self.entries[entry]
        if data != found.data:
            found.data, found.changed = data, True

    def xml(self, entry: str) -> bytes:
        """An XML part's bytes, vetted: :class:`MtkitError` naming it for a DTD, an entity or XML that is not
        well-formed."""
        data = self.read(entry)
        vet_xml(data, f"{self.name}: {entry}")
        return data

    def write(self) -> bytes:
        """The archive with its replaced entries; the others hold the same bytes as before."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as zf:
            for entry in self.entries.values():
                info = entry.info
                if entry.changed:
                    fresh = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                    fresh.compress_type, fresh.external_attr = info.compress_type, info.external_attr
                    fresh.create_system = info.create_system
                    zf.writestr(fresh, entry.data)
                else:
                    zf.writestr(info, entry.data, compress_type=info.compress_type)
        return out.getvalue()


def vet_xml(data: bytes, where: str) -> None:
    """Parse ``data`` with defusedxml, refusing a DTD (entities, billion laughs, XXE) and any entity; ``where`` names
    it in the one-line error."""
    try:
        fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as e:
        raise MtkitError(f"{where}: refused XML ({type(e).__name__}: a DTD or an entity, which a document never "
                         "needs)") from None
    except ParseError as e:
        raise MtkitError(f"{where}: not well-formed XML ({e})") from None


def parse_xml(data: bytes, where: str):
    """An lxml tree of ``data`` after :func:`vet_xml` (lxml keeps prefixes and declarations, which Office and
    LibreOffice need written back as they were); never resolves entities or reads the network."""
    vet_xml(data, where)
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False, remove_blank_text=False)
    try:
        return etree.fromstring(data, parser)
    except etree.XMLSyntaxError as e:
        raise MtkitError(f"{where}: not well-formed XML ({e})") from None
