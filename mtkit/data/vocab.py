"""SentencePiece vocabularies: one joint model (the paper's shared vocabulary, §5.1) or two.

The SentencePiece model is the vocabulary: token ids come from it alone. Every
model mtkit uses has pad=0, unk=1, bos=2, eos=3 (``mtkit.config``); a model
passed in with other ids is refused.

An imported model (mtkit.importers: Marian / OPUS-MT) keeps its own vocabulary instead: its
SentencePiece models only segment, and a piece table (``pieces``: id -> piece, one table shared
by both sides or one per side) gives the ids, a piece missing from it being unk, as Marian and
Hugging Face's MarianTokenizer do. The table is stored beside the models (checkpoint key
``vocab.pieces``, file ``pieces.json``) and has mtkit's special ids.

Text is never a control channel: SentencePiece matches a user-defined piece (a multilingual model's
``<2fr>``) wherever the text holds it, so the text is encoded with a copy of the model in which those
pieces are unused (``<2fr>`` typed in a line is the characters ``<``, ``2``, ``f``, ``r``, ``>``); tags
are added by id (:mod:`mtkit.data.languages`). Control pieces (``<s>``, ``</s>``, ``<pad>``) and
``<unk>`` are never matched in text. A model without user-defined pieces encodes as it always did.
Decoded text is trimmed (no leading or trailing whitespace, as Hugging Face's tokenizers decode).
A lone surrogate (``"\\ud800"`` in JSON) cannot be encoded: :func:`first_lone_surrogate` finds one,
and callers report it as a one-line error.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SpmConfig
from mtkit.data.word_alignment import piece_words
from mtkit.errors import MtkitError, shown
from mtkit.io import MAX_VOCAB_BYTES, atomic_write_bytes, read_bounded, read_json_file

JOINT_FILE = "spm.model"
SRC_FILE = "spm.src.model"
TGT_FILE = "spm.tgt.model"
PIECES_FILE = "pieces.json"  # the piece table of an imported vocabulary: {"src": [...], "tgt": [...] | null}
# (and "special": [...], the pieces decoding drops, as Hugging Face's skip_special_tokens)
# SentencePiece encodes a list on a thread pool that it starts for the call, even with one thread,
# which costs a short list (a served request is often one line) many times the encoding itself.
# Shorter lists are encoded one sentence at a time.
BATCH_ENCODE_MIN = 16

_SPECIAL = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}


def _processor(model: bytes, name: str, check_ids: bool = True) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model)
    except (RuntimeError, OSError) as e:
        raise MtkitError(f"{name}: not a SentencePiece model ({str(e).strip().splitlines()[0]})") from None
    if not check_ids:  # a piece table gives the ids
        return sp
    found = {"pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id()}
    if found != _SPECIAL:
        raise MtkitError(
            f"{name}: special ids {found} differ from mtkit's {_SPECIAL};"
            " retrain it with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3"
        )
    return sp


def first_lone_surrogate(text: str) -> int | None:
    """The 0-based index of the first lone surrogate (U+D800-U+DFFF) in ``text``, None if it has none.

    Python strings hold them (``json.loads('"\\ud800"')``, ``surrogateescape`` decoding), but they are
    not Unicode text: SentencePiece (and UTF-8) cannot encode them. Callers turn a hit into a one-line
    error naming the file and line (or the request field) and the character position (from 1).
    """
    for i, c in enumerate(text):
        if "\ud800" <= c <= "\udfff":
            return i
    return None


def check_text(text: str, where: str) -> None:
    """Raise :class:`MtkitError` naming ``where`` when ``text`` holds a lone surrogate (see
    :func:`first_lone_surrogate`)."""
    at = first_lone_surrogate(text)
    if at is not None:
        raise MtkitError(f"{where}: character {at + 1} is a lone surrogate (U+{ord(text[at]):04X}), "
                         "which is not Unicode text and cannot be encoded")


def _plain_processor(model: bytes, sp: spm.SentencePieceProcessor) -> spm.SentencePieceProcessor:
    """A processor that encodes text as ``sp`` does, except that it never matches a user-defined piece
    (a target-language tag): those pieces are marked unused, so their characters are segmented as any
    others. ``sp`` itself when it has none (or without protobuf)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # pragma: no cover - protobuf is missing
        return sp
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    kind = sentencepiece_model_pb2.ModelProto.SentencePiece
    reserved = [p for p in proto.pieces if p.type == kind.USER_DEFINED]
    if not reserved:
        return sp
    for p in reserved:
        p.type = kind.UNUSED
    plain = spm.SentencePieceProcessor()
    plain.LoadFromSerializedProto(proto.SerializeToString())
    return plain


def _strip_special(ids: Iterable[int]) -> list[int]:
    return [int(i) for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)]


class PieceTable:
    """Ids through a table (an imported vocabulary): id -> piece and back, unknown pieces -> UNK_ID."""

    def __init__(self, pieces: Sequence[str], special: Iterable[str] = ()) -> None:
        self.pieces = list(pieces)
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        # ids that decoding drops besides PAD/BOS/EOS (an NLLB model's language codes, <s>, <unk>, <mask>: what
        # Hugging Face's skip_special_tokens drops)
        self.hidden = frozenset(self.ids[p] for p in special if p in self.ids)

    def encode(self, sp: spm.SentencePieceProcessor, text: str, **sampling) -> list[int]:
        # Marian's multilingual models take a target-language token ">>xx<<" before the text, whole.
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return [self.ids.get(p, UNK_ID) for p in code + sp.encode(text, out_type=str, **sampling)]

    def decode(self, sp: spm.SentencePieceProcessor, ids: Iterable[int]) -> str:
        return sp.decode_pieces([self.pieces[i] for i in _strip_special(ids) if i not in self.hidden]).strip()


def _tables(pieces: dict | None) -> tuple[PieceTable, PieceTable] | None:
    if pieces is None:
        return None
    special = pieces.get("special") or ()
    if not isinstance(special, (list, tuple)) or not all(isinstance(p, str) for p in special):
        raise MtkitError(f"vocab.pieces.special must be a list of pieces, got {shown(special)}")
    src = PieceTable(pieces["src"], special)
    return src, PieceTable(pieces["tgt"], special) if pieces.get("tgt") is not None else src


class Vocab:
    """One (joint) or two SentencePiece processors; ids exclude bos/eos unless added by the caller.

    With ``pieces`` ({"src": list, "tgt": list | None}), ids come from those tables (an imported
    vocabulary, see the module's docstring).
    """

    def __init__(self, src: spm.SentencePieceProcessor, tgt: spm.SentencePieceProcessor | None,
                 src_model: bytes, tgt_model: bytes | None, pieces: dict | None = None) -> None:
        self._src = src
        self._tgt = tgt if tgt is not None else src
        # What encodes text: the same models with user-defined pieces (tags) unused, see the module docstring.
        self._src_text = _plain_processor(src_model, self._src)
        self._tgt_text = _plain_processor(tgt_model, self._tgt) if tgt is not None else self._src_text
        self._models = (src_model, tgt_model)
        self.joint = tgt is None
        self._pieces = pieces
        self._tables = _tables(pieces)

    # ----------------------------------------------------------------- loading

    @classmethod
    def from_bytes(cls, src_model: bytes, tgt_model: bytes | None = None, pieces: dict | None = None) -> Vocab:
        """A joint vocabulary from one model, or separate ones from two serialized models; ``pieces``:
        an imported vocabulary's piece table(s)."""
        check = pieces is None
        src = _processor(src_model, "source SentencePiece model" if tgt_model else "SentencePiece model", check)
        tgt = _processor(tgt_model, "target SentencePiece model", check) if tgt_model is not None else None
        return cls(src, tgt, src_model, tgt_model, pieces)

    @classmethod
    def from_files(cls, src_path: Path, tgt_path: Path | None = None, pieces: dict | None = None) -> Vocab:
        models = []
        for path in (src_path, tgt_path):
            if path is None:
                models.append(None)
                continue
            models.append(read_bounded(path, MAX_VOCAB_BYTES, "SentencePiece model"))
        src = _processor(models[0], str(src_path), pieces is None)
        tgt = _processor(models[1], str(tgt_path), pieces is None) if tgt_path is not None else None
        return cls(src, tgt, models[0], models[1], pieces)

    @classmethod
    def load(cls, out_dir: Path) -> Vocab:
        """The vocabulary of a prepared directory (``spm.model`` or ``spm.src.model`` + ``spm.tgt.model``)."""
        out_dir = Path(out_dir)
        pieces = _read_pieces(out_dir / PIECES_FILE)
        if (out_dir / JOINT_FILE).is_file():
            return cls.from_files(out_dir / JOINT_FILE, pieces=pieces)
        if (out_dir / SRC_FILE).is_file() and (out_dir / TGT_FILE).is_file():
            return cls.from_files(out_dir / SRC_FILE, out_dir / TGT_FILE, pieces)
        raise MtkitError(f"{out_dir}: no {JOINT_FILE} (or {SRC_FILE} + {TGT_FILE}); run 'mtkit prepare' first")

    def save(self, out_dir: Path) -> list[str]:
        """Write the model file(s) into ``out_dir``; return their names."""
        src_model, tgt_model = self._models
        extra = []
        if self._pieces is not None:
            atomic_write_bytes(Path(out_dir) / PIECES_FILE, json.dumps(self._pieces, ensure_ascii=False).encode())
            extra = [PIECES_FILE]
        if tgt_model is None:
            atomic_write_bytes(Path(out_dir) / JOINT_FILE, src_model)
            return [JOINT_FILE, *extra]
        atomic_write_bytes(Path(out_dir) / SRC_FILE, src_model)
        atomic_write_bytes(Path(out_dir) / TGT_FILE, tgt_model)
        return [SRC_FILE, TGT_FILE, *extra]

    def model_bytes(self) -> tuple[bytes, bytes | None]:
        """The serialized model(s): ``(joint, None)`` or ``(source, target)``; with :meth:`pieces`,
        enough to rebuild the Vocab."""
        return self._models

    def text_models(self) -> tuple[bytes, bytes | None]:
        """The serialized model(s) that text is encoded with (user-defined pieces unused: typed text never
        yields a tag), ``(joint, None)`` or ``(source, target)``: what an exported tokenizer segments with."""
        src = self._src_text.serialized_model_proto()
        return src, None if self.joint else self._tgt_text.serialized_model_proto()

    def pieces(self) -> dict | None:
        """An imported vocabulary's piece table(s), ``{"src": list, "tgt": list | None}``; None for a
        SentencePiece model's own ids."""
        return self._pieces

    # ------------------------------------------------------------------- sizes

    @property
    def src_size(self) -> int:
        return len(self._tables[0].pieces) if self._tables else self._src.get_piece_size()

    @property
    def tgt_size(self) -> int:
        return len(self._tables[1].pieces) if self._tables else self._tgt.get_piece_size()

    # ------------------------------------------------------------ text <-> ids

    def encode_src(self, text: str) -> list[int]:
        """Source ids of ``text`` (no tag, no EOS); text never yields a reserved piece (module docstring)."""
        sp = self._src_text
        return self._tables[0].encode(sp, text) if self._tables else sp.encode(text)

    def encode_tgt(self, text: str) -> list[int]:
        sp = self._tgt_text
        return self._tables[1].encode(sp, text) if self._tables else sp.encode(text)

    def encode_src_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._tables or len(texts) < BATCH_ENCODE_MIN:
            return [self.encode_src(t) for t in texts]
        return self._src_text.encode(list(texts), num_threads=1)

    def encode_tgt_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._tables or len(texts) < BATCH_ENCODE_MIN:
            return [self.encode_tgt(t) for t in texts]
        return self._tgt_text.encode(list(texts), num_threads=1)

    def sample_batch(self, side: str, texts: Sequence[str], dropout: float) -> list[list[int]]:
        """Sampled segmentations of ``texts`` (BPE-dropout ``dropout`` for a BPE model), seeded by
        ``sentencepiece.set_random_generator_seed``."""
        sp = self._src_text if side == "src" else self._tgt_text
        if self._tables:
            table = self._tables[0 if side == "src" else 1]
            return [table.encode(sp, t, enable_sampling=True, alpha=dropout, nbest_size=-1) for t in texts]
        return sp.encode(list(texts), enable_sampling=True, alpha=dropout, nbest_size=-1, num_threads=1)

    def _proto(self, side: str):
        """The parsed ModelProto of the ``side`` ("src" or "tgt") model; None without protobuf."""
        try:
            from sentencepiece import sentencepiece_model_pb2
        except ImportError:  # pragma: no cover - protobuf is missing
            return None
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(self._models[0] if side == "src" or self.joint else self._models[1])
        return proto

    def model_type(self, side: str) -> str | None:
        """"bpe", "unigram", "char" or "word" for the ``side`` ("src" or "tgt") model; None if unknown."""
        proto = self._proto(side)
        if proto is None:  # pragma: no cover
            return None
        return proto.trainer_spec.ModelType.Name(proto.trainer_spec.model_type).lower()

    def lowercases(self, side: str) -> bool:
        """True if the ``side`` model case-folds its input (a ``*_cf`` normalization rule), so that
        its decoded text is lowercase."""
        proto = self._proto(side)
        return proto is not None and proto.normalizer_spec.name.endswith("_cf")

    def src_piece_id(self, piece: str) -> int | None:
        """The source id of ``piece`` as a whole (e.g. a target-language tag), or None if it has none."""
        if self._tables:
            return self._tables[0].ids.get(piece)
        found = self._src.piece_to_id(piece)
        return found if found != UNK_ID and self._src.id_to_piece(found) == piece else None

    def tgt_piece_id(self, piece: str) -> int | None:
        """The target id of ``piece`` as a whole (a tag on the target side), or None if it has none."""
        if self._tables:
            return self._tables[1].ids.get(piece)
        found = self._tgt.piece_to_id(piece)
        return found if found != UNK_ID and self._tgt.id_to_piece(found) == piece else None

    def decode_src(self, ids: Iterable[int]) -> str:
        """Text of source ids, trimmed; pad/bos/eos are dropped."""
        if self._tables:
            return self._tables[0].decode(self._src, ids)
        return self._src.decode(_strip_special(ids)).strip()

    def decode_tgt(self, ids: Iterable[int]) -> str:
        """Text of target ids, trimmed (a last piece ``▁`` leaves no trailing space); pad/bos/eos are dropped."""
        if self._tables:
            return self._tables[1].decode(self._tgt, ids)
        return self._tgt.decode(_strip_special(ids)).strip()

    def src_words(self, text: str) -> list[int]:
        """The word of ``text`` (an index into ``text.split()``, -1 for none) of each id of :meth:`encode_src`,
        from SentencePiece's offsets (:func:`mtkit.data.word_alignment.piece_words`)."""
        return self._text_words(self._src_text, self._tables[0] if self._tables else None, text)

    def tgt_text_words(self, text: str) -> list[int]:
        """As :meth:`src_words`, for each id of :meth:`encode_tgt`."""
        return self._text_words(self._tgt_text, self._tables[1] if self._tables else None, text)

    @staticmethod
    def _text_words(sp: spm.SentencePieceProcessor, table: PieceTable | None, text: str) -> list[int]:
        code = b""
        if table is not None and text.startswith(">>") and (end := text.find("<<")) != -1:  # PieceTable.encode's
            code = text[: end + 2].encode("utf-8")
        rest = text[len(code.decode("utf-8")):]
        proto = sp.encode(rest, out_type="proto") if rest else None
        spans = [(len(code) + p.begin, len(code) + p.end) for p in proto.pieces] if proto is not None else []
        return piece_words(text, ([(0, len(code))] if code else []) + spans)

    def tgt_words(self, ids: Sequence[int]) -> list[int]:
        """The word of :meth:`decode_tgt`'s text (an index into its ``split()``, -1 for none) of each of ``ids``
        (-1 for PAD, BOS and EOS)."""
        real = [k for k, i in enumerate(ids) if i not in (PAD_ID, BOS_ID, EOS_ID)]
        if self._tables:
            sp_ids = [self._tgt.piece_to_id(p) for p in self.tgt_pieces(ids[k] for k in real)]
        else:
            sp_ids = [int(ids[k]) for k in real]
        proto = self._tgt.decode(sp_ids, out_type="proto")
        words = piece_words(proto.text, [(p.begin, p.end) for p in proto.pieces])
        found = [-1] * len(ids)
        for k, w in zip(real, words, strict=True):
            found[k] = w
        return found

    def src_pieces(self, ids: Iterable[int]) -> list[str]:
        if self._tables:
            return [self._tables[0].pieces[int(i)] for i in ids]
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: Iterable[int]) -> list[str]:
        if self._tables:
            return [self._tables[1].pieces[int(i)] for i in ids]
        return [self._tgt.id_to_piece(int(i)) for i in ids]


def _read_pieces(path: Path) -> dict | None:
    """The piece table(s) saved beside the SentencePiece models (:data:`PIECES_FILE`), or None."""
    if not path.is_file():
        return None
    pieces = read_json_file(path, MAX_VOCAB_BYTES, "piece table")
    if not isinstance(pieces, dict) or not isinstance(pieces.get("src"), list):
        raise MtkitError(f"{path}: not a piece table (expected {{\"src\": [...], \"tgt\": [...] or null}})")
    return pieces


def train_model(sentences: Sequence[str], spm_config: SpmConfig, threads: int = 1,
                user_symbols: Sequence[str] = ()) -> bytes:
    """Train one SentencePiece model on ``sentences`` (a bounded sample) and return it serialized.

    ``user_symbols``: pieces reserved whole (a multilingual model's target-language tags); none for
    a single-pair model, whose training call is then what it always was.
    """
    if not sentences:
        raise MtkitError("data.train: no sentences left to train SentencePiece on")
    writer = io.BytesIO()
    extra = {"user_defined_symbols": list(user_symbols)} if user_symbols else {}
    try:
        spm.SentencePieceTrainer.train(
            **extra,
            sentence_iterator=iter(sentences),
            model_writer=writer,
            model_type=spm_config.model_type,
            vocab_size=spm_config.vocab_size,
            character_coverage=spm_config.character_coverage,
            normalization_rule_name="nmt_nfkc_cf" if spm_config.lowercase else "nmt_nfkc",
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            hard_vocab_limit=False,
            input_sentence_size=0,  # the caller's reservoir sample already bounds memory
            max_sentence_length=1 << 16,
            num_threads=max(1, threads),
            minloglevel=2,
        )
    except RuntimeError as e:
        raise MtkitError(f"data.spm: SentencePiece training failed: {str(e).strip().splitlines()[-1]}") from None
    return writer.getvalue()
