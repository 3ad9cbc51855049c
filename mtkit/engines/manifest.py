"""``mtkit.json``: the record every export keeps beside its model files, written and read here only.

The CTranslate2 (:mod:`mtkit.export.ctranslate2`), ONNX (:mod:`mtkit.export.onnx`) and Hugging Face
(:mod:`mtkit.export.huggingface`) exporters write it; the CTranslate2 and ONNX engines and
``mtkit import marian`` read it back. It sits with the engines, below the exporters and importers, so that
every reader imports it downward. Its fields, each absent where it does not apply:

* ``mtkit_version``, ``checkpoint``, ``step``: what was exported, by which mtkit (every export, first);
* ``spm``: the SentencePiece model file(s) beside it (CTranslate2, ONNX);
* ``quantization``: CTranslate2's weight type (null: the checkpoint's float32);
* ``architecture``: the Hugging Face architecture, ``marian`` or ``pegasus``;
* ``model``, ``decode``: the recipe's sections (``decode``: what the engines decode with unless told
  otherwise; ``mtkit import marian`` reads it back whole);
* ``alignment``: ``{layer, head}``, the cross-attention CTranslate2's ``return_attention`` gives;
* ``src_vocab_size``, ``tgt_vocab_size``, ``graphs``: the ONNX graphs' files, inputs and outputs;
* ``data`` (``{src_lang, tgt_lang}``), ``pairs`` and ``tag_side``: the languages of the model.

A manifest is a stranger's file once it is on disk: it is read in work bounded by its size
(:func:`mtkit.io.read_json_file`) and its fields are type-checked (:func:`check_types`) before use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mtkit.config import config_from_dict
from mtkit.errors import MtkitError, shown
from mtkit.io import MAX_CONFIG_BYTES, read_json_file
from mtkit.version import __version__

NAME = "mtkit.json"


def record(loaded, **fields: Any) -> dict:
    """The manifest of an export of ``loaded`` (a LoadedModel): what was exported, then ``fields`` in order."""

    return {"mtkit_version": __version__, "checkpoint": str(loaded.path), "step": getattr(loaded, "step", None),
            **fields}


def languages(data) -> dict:
    """The ``pairs`` and ``tag_side`` fields of a multilingual model's ``data`` config ({} for one pair): its
    sources (or its decoder) start with a language tag (:mod:`mtkit.data.languages`)."""
    pairs = [[p.src_lang, p.tgt_lang] for p in data.pairs]
    return {"pairs": pairs, "tag_side": data.tag_side} if pairs else {}


def write(folder: str | Path, manifest: dict) -> Path:
    """Write ``manifest`` as ``folder/mtkit.json``; its path."""
    path = Path(folder) / NAME
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path


def read(folder: str | Path, what: str) -> Any:
    """``folder/mtkit.json`` as it is (any JSON value), read in bounded work; ``what`` names it in errors."""
    return read_json_file(Path(folder) / NAME, MAX_CONFIG_BYTES, what)


def read_object(folder: str | Path, what: str) -> dict:
    """``folder/mtkit.json``, which must be a JSON object, its fields type-checked (:func:`check_types`)."""
    path = Path(folder) / NAME
    manifest = read(folder, what)
    if not isinstance(manifest, dict):
        raise MtkitError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    check_types(manifest, path)
    return manifest


def check_types(manifest: dict, path: Path) -> None:
    """Each field's type, and the ``model`` and ``decode`` sections through the recipe's checks: a field of
    another type is one line naming ``path`` and the key."""

    def bad(key: str, expected: str) -> None:
        raise MtkitError(f"{path}: {key} must be {expected}, got {shown(manifest[key])}")

    for key, kind, expected in (("mtkit_version", str, "a string"), ("checkpoint", str, "a string"),
                                ("quantization", str, "a string")):
        if manifest.get(key) is not None and not isinstance(manifest[key], kind):
            bad(key, expected)
    step = manifest.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        bad("step", "an integer")
    spm = manifest.get("spm")
    if spm is not None and (not isinstance(spm, list) or not all(isinstance(n, str) for n in spm)):
        bad("spm", "a list of file names")
    pairs = manifest.get("pairs")
    if pairs is not None and (not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs)):
        bad("pairs", "a list of [source, target] language pairs")
    if manifest.get("tag_side") is not None and manifest["tag_side"] not in ("source", "target", "codes"):
        bad("tag_side", "'source', 'target' or 'codes'")
    alignment = manifest.get("alignment")
    if alignment is not None and not (
            isinstance(alignment, dict) and set(alignment) == {"layer", "head"}
            and all(v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 16)
                    for v in alignment.values()) and alignment["layer"] is not None):
        bad("alignment", "{layer: N, head: N or null}")
    for section in ("model", "decode"):
        value = manifest.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            bad(section, "a mapping")
        try:
            config_from_dict({section: value})
        except MtkitError as e:
            raise MtkitError(f"{path}: {e}") from None
