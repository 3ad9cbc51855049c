"""The one scaffold every exporter runs (:func:`export`): refuse, build beside, check, rename.

1. **refuse**: what cannot be exported is one line before any work (:meth:`Exporter.refuse`: the options the
   target format cannot express, each named), then an output folder that holds something, then a missing
   optional package (:meth:`Exporter.require`);
2. **prepare** in memory what needs no disk (a CTranslate2 spec, validated; a Hugging Face model);
3. **build beside**: write into a temporary folder next to the output (:func:`mtkit.io.atomic_directory`),
   so that a failure, a full disk or an interrupt leaves nothing at the output;
4. **check** the export against the original model (:meth:`Exporter.check`: ONNX Runtime's and Hugging Face's
   logits against mtkit's), still beside the output;
5. **rename** the folder into place, in one step.

An exporter (:class:`Exporter`) fills the steps in; :mod:`mtkit.export.ctranslate2`, :mod:`mtkit.export.onnx`
and :mod:`mtkit.export.huggingface` are the three, and :mod:`mtkit.export.cache` keeps a CTranslate2 export
built the same way (then :func:`replace_directory` puts it in place of an outdated one).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from mtkit.errors import MtkitError
from mtkit.io import atomic_directory, refuse_non_empty


class Exporter:
    """One export of one model: the steps :func:`export` runs, in its order. Each default does nothing."""

    target = "?"  # the format, as messages name it: "cannot export to {target}: ..."

    def refusals(self) -> list[str]:
        """What of the model the format cannot express, one line each (nothing is done when there is any)."""
        return []

    def refuse(self) -> None:
        """Refuse an export that cannot be made, in one line, before any work."""
        problems = self.refusals()
        if problems:
            raise MtkitError(f"cannot export to {self.target}: " + "; ".join(problems))

    def require(self) -> None:
        """Import the optional packages the export needs, or refuse in one line naming the extra."""

    def prepare(self) -> None:
        """What is built in memory before anything is written (and checked there, where it can be)."""

    def building(self) -> contextlib.AbstractContextManager:
        """The context :meth:`write` and :meth:`check` run in (another library's warnings silenced...)."""
        return contextlib.nullcontext()

    def write(self, folder: Path) -> None:
        """Write the export into ``folder``, the temporary folder beside the output."""
        raise NotImplementedError

    def check(self, folder: Path) -> None:
        """Check the export written in ``folder`` against the original model; one line where it differs."""


def export(exporter: Exporter, out_dir: str | Path) -> Path:
    """Run ``exporter``'s steps into ``out_dir`` (refused when it holds something): refuse, prepare, build
    beside, check, rename into place. A failure at any step leaves nothing at ``out_dir``."""
    out_dir = Path(out_dir)
    exporter.refuse()
    refuse_non_empty(out_dir)
    exporter.require()
    exporter.prepare()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out_dir) as tmp, exporter.building():  # its errors name out_dir
        exporter.write(tmp)
        exporter.check(tmp)
    return out_dir


def replace_directory(made: Path, folder: Path, trash: Path) -> Path:
    """Put the folder ``made`` at ``folder`` in one rename, an existing ``folder`` first moved to ``trash``
    (beside both: a directory is not replaced by a rename onto it); a reader of the old one keeps its files."""
    if folder.exists():
        os.replace(folder, trash)
    os.replace(made, folder)
    return folder


def file_modes(folder: Path) -> None:
    """The files of ``folder`` readable as any other output (the umask's modes): some writers make 0600."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)
