"""Translate with a model exported to CTranslate2 (:mod:`mtkit.export.ctranslate2`), behind the engines'
common pipeline (:class:`mtkit.engines.engine.Engine`).

:class:`Ctranslate2Engine` never imports torch: CTranslate2
bound to torch's OpenMP runtime runs several times slower.

Search: CTranslate2's beam search is fairseq's, as mtkit's (the ``2·beam`` best
extensions by cumulative log-probability; those among the first ``beam`` that end
in EOS finish, the first ``beam`` others go on). It stops a sentence once it holds
``beam`` finished hypotheses (``patience`` 1), as mtkit does, but only when its
``length_penalty`` is non-zero: at 0 it stops when the best live hypothesis ends
instead. So the engine always passes a non-zero penalty, CTranslate2's
``logprob / L ** length_penalty`` with ``L`` counting the EOS (``return_end_token``),
which for ``length_penalty: power`` is mtkit's own, and asks for ``beam``
hypotheses. Their log-probabilities are recovered and scored with mtkit's penalty
(GNMT's ``((5 + L) / 6) ** alpha`` has no CTranslate2 equivalent, but it only ranks
the finished hypotheses, which are the same; where more than ``beam`` finish at one
step, CTranslate2 keeps the ``beam`` best by ``L ** alpha`` and mtkit the first
``beam`` to finish, which only a GNMT ranking far from ``L ** alpha`` could tell
apart). mtkit's early stop (the best finished
score can no longer be beaten) never changes the best hypothesis, only, at times, the
lower entries of an n-best list.

Maximum length: mtkit allows ``max(1, int(a·S + b))`` tokens before the EOS per
sentence (``S`` counts the source ids with EOS) and forces EOS there;
CTranslate2 takes one ``max_decoding_length`` per call, in steps, the EOS step
included, and cuts a hypothesis at the last step without an EOS. A batch is first
decoded with its largest maximum plus one step; each sentence whose hypotheses
reached its own maximum (so fewer than ``beam`` had finished before it) is decoded
again with that maximum, keeping every finished hypothesis (``patience`` 2 cannot stop
such a search earlier), a hypothesis cut there gets the EOS that mtkit forces, with
its log-probability (``score_batch``), and the first ``beam`` to finish are kept, as
mtkit keeps them.
What remains different: at the step before its maximum, mtkit can still carry on a
hypothesis from beyond the first ``beam`` candidates to be finished by the forced EOS,
where CTranslate2 finishes the first ``beam`` candidates as they are. mtkit bans PAD
and BOS from outputs; CTranslate2 is not asked to (its ``suppress_sequences`` would
renormalize the distribution and change every score), and a trained model gives
them next to no probability. For the same reason ``decode.min_len`` (EOS banned before it)
scores differently: CTranslate2 renormalizes without EOS.

Constraints: ``exclude`` phrases are CTranslate2's ``suppress_sequences`` (so the scores of such a
sentence are renormalized without the banned pieces, unlike mtkit's search); ``include`` phrases,
and so glossaries, are an error (:func:`mtkit.engines.capabilities.include_refusal`): CTranslate2 has no
lexically constrained search, and its ``target_prefix`` only forces a translation's beginning. What the engine
can do is declared once, in :data:`mtkit.engines.capabilities.CTRANSLATE2`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtkit.checkpoints.io import layer_count
from mtkit.config import EOS_ID, UNK_ID, DecodeConfig, config_from_dict, saved_decode
from mtkit.data.languages import decoder_prefix, decoder_start, pairs_from_list
from mtkit.data.vocab import Vocab
from mtkit.decoding.penalties import length_penalty
from mtkit.engines import manifest as manifest_file
from mtkit.engines.capabilities import CTRANSLATE2, TORCH, include_refusal
from mtkit.engines.constraints import PieceConstraints
from mtkit.engines.device import resolve_device
from mtkit.engines.engine import Call, Engine, EngineOptions
from mtkit.errors import MtkitError
from mtkit.shortlist import VMAP_FILE

# The weights an export may have (mtkit export ctranslate2 --quantization; --engine ctranslate2 --quantization).
QUANTIZATIONS = CTRANSLATE2.quantizations
INCLUDE_UNSUPPORTED = include_refusal(CTRANSLATE2.name)  # the one line refusing include phrases and glossaries


@dataclass(frozen=True)
class CpuThreads:
    """A CTranslate2 engine's threads, fixed when it loads the model.

    Args:
        intra: threads per translation (0: ``chosen``, else CTranslate2's default). An int8 model on the CPU
            is given one thread when 0 is asked (fastest on small CPUs).
        inter: batches translated at the same time, from several threads (CTranslate2's ``inter_threads``).
        chosen: the count mtkit chose from the CPUs free (:mod:`mtkit.engines.threads`) for a CPU without a
            user's count, and why: ``(n, why)``.
    """

    intra: int = 0
    inter: int = 1
    chosen: tuple[int, str] | None = None


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise MtkitError("CTranslate2 is not installed; run: pip install 'mtkit[export]' "
                         "(or pip install ctranslate2)") from None
    return ctranslate2


def read_manifest(model_dir: Path) -> dict:
    """The ``mtkit.json`` of an exported model directory ({} for a model exported by other tools), its
    fields type-checked (:func:`mtkit.engines.manifest.read_object`) and its model config checked against what
    ``model.bin`` holds (:func:`check_manifest_against_model`): a manifest that disagrees is a one-line error
    naming the key."""
    model_dir = Path(model_dir)
    if not (model_dir / "model.bin").is_file():
        raise MtkitError(f"{model_dir}: not a CTranslate2 model directory (no model.bin); "
                         "create one with 'mtkit export ctranslate2'")
    path = model_dir / manifest_file.NAME
    if not path.is_file():
        return {}
    manifest = manifest_file.read_object(model_dir, "model manifest")
    if manifest.get("model") is not None:
        check_manifest_against_model(manifest, path, model_dir / "model.bin")
    return manifest


def model_bin_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """The variables of a CTranslate2 ``model.bin`` (binary version 6) with their shapes, its aliases
    included, read from the headers without reading the weights (a scalar's shape is its value, for
    ``num_heads``); None for another binary version (CTranslate2 itself checks those). A file cut short
    or not in the format is a one-line error."""
    size = path.stat().st_size
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        with open(path, "rb") as f:
            def read(fmt: str):
                n = struct.calcsize(fmt)
                data = f.read(n)
                if len(data) != n:
                    raise ValueError("cut short")
                return struct.unpack(fmt, data)[0]

            def string() -> str:
                n = read("H")
                data = f.read(n)
                if len(data) != n or not n:
                    raise ValueError("cut short")
                return data[:-1].decode("utf-8")

            if read("I") != 6:
                return None
            string()  # the spec's name
            read("I")  # its revision
            for _ in range(read("I")):
                name = string()
                rank = read("B")
                dims = tuple(read("I") for _ in range(rank))
                read("B")  # dtype
                nbytes = read("I")
                if f.tell() + nbytes > size:
                    raise ValueError(f"{name} is cut short")
                if name.endswith("/num_heads") and rank == 0 and nbytes in (1, 2, 4):
                    dims = (int.from_bytes(f.read(nbytes), "little", signed=True),)
                else:
                    f.seek(nbytes, 1)
                shapes[name] = dims
            for _ in range(read("I")):
                alias, target = string(), string()
                if target in shapes:
                    shapes[alias] = shapes[target]
    except (ValueError, UnicodeDecodeError) as e:
        raise MtkitError(f"{path}: not a readable CTranslate2 model ({e}); export it again") from None
    return shapes


def check_manifest_against_model(manifest: dict, path: Path, model_bin: Path) -> None:
    """Refuse a manifest whose ``model`` sizes (layers, d_model, h, d_ff, max_positions) ``model.bin``
    does not have: one line naming the key and both values."""
    m = config_from_dict({"model": manifest["model"]}).model
    shapes = model_bin_shapes(model_bin)
    if shapes is None:
        return

    def refuse(key: str, value: int, has: str) -> None:
        raise MtkitError(f"{path}: model.{key} is {value} but {model_bin.name} has {has}")

    names = [n.replace("/", ".") for n in shapes]
    for side in ("encoder", "decoder"):
        n = layer_count([k.replace("layer_", "layers.") for k in names], side)
        if n != getattr(m, f"{side}_layers"):
            refuse(f"{side}_layers", getattr(m, f"{side}_layers"), f"{n} {side} layer" + ("" if n == 1 else "s"))
    for key, name, axis in (("d_model", "encoder/embeddings_0/weight", 1),
                            ("d_ff", "encoder/layer_0/ffn/linear_0/weight", 0),
                            ("max_positions", "encoder/position_encodings/encodings", 0),
                            ("h", "encoder/num_heads", 0)):  # a scalar: its value (model_bin_shapes)
        shape = shapes.get(name)
        if shape is not None and len(shape) > axis and shape[axis] != getattr(m, key):
            refuse(key, getattr(m, key),
                   f"{name} {shape[0]}" if key == "h" else f"{name} of {' × '.join(map(str, shape))}")


def exported_decode(model_dir: Path) -> DecodeConfig:
    """The decode settings saved with the exported checkpoint (the defaults when there are none)."""
    return saved_decode(read_manifest(model_dir).get("decode") or None, Path(model_dir) / manifest_file.NAME)


class Ctranslate2Engine(Engine):
    """Translate with an exported model in CTranslate2, behind mtkit's line pipeline.

    Args:
        model_dir: written by :func:`export_model`.
        options: the device, the precision (``fp32`` keeps the exported weights' type, e.g. int8 stays int8;
            ``bf16`` / ``fp16`` ask CTranslate2 for that compute type) and whether it warns
            (:class:`EngineOptions`).
        threads: its :class:`CpuThreads`.
        languages: the pairs (and single pair) of the model; None: those it was exported with.
        target: the target language a call without one translates into.
    """

    capabilities = CTRANSLATE2

    def __init__(self, model_dir: str | Path, decode: DecodeConfig, options: EngineOptions = EngineOptions(),
                 threads: CpuThreads = CpuThreads(), languages: tuple[list, tuple[str, str] | None] | None = None,
                 target: str | None = None) -> None:
        ctranslate2 = import_ctranslate2()
        device, precision, intra_threads = options.device, options.precision, threads.intra
        model_dir = Path(model_dir)
        manifest = read_manifest(model_dir)
        vocab = Vocab.load(model_dir)
        max_positions = manifest.get("model", {}).get("max_positions")
        if languages is None:  # the pairs and the tag side it was exported with
            data = manifest.get("data") or {}
            single = (data["src_lang"], data["tgt_lang"]) if data.get("src_lang") and data.get("tgt_lang") else None
            languages = (pairs_from_list(manifest.get("pairs")), single)
        super().__init__(vocab, decode, max_positions, languages=languages,
                         tag_side=manifest.get("tag_side") or "source", target=target)
        self.warn = options.warn
        self.vmap = model_dir / VMAP_FILE  # a vocabulary map (mtkit shortlist's, exported), if there is one
        if decode.shortlist:
            self._check_vmap()
        compute_type = {"fp32": "default", "bf16": "bfloat16", "fp16": "float16"}.get(precision)
        if compute_type is None:
            raise MtkitError(f"unknown precision {precision!r}; expected fp32, bf16 or fp16")
        device = resolve_device(device, cuda_devices=ctranslate2.get_cuda_device_count())
        device_index = 0
        if device.startswith("cuda:"):
            device, device_index = "cuda", int(device.split(":", 1)[1])
        self.threads_said = None  # "threads: N (why)" for a count chosen here
        if intra_threads <= 0 and device == "cpu":
            if str(manifest.get("quantization", "")).startswith("int8"):
                intra_threads, self.threads_said = 1, "threads: 1 (an int8 model: fastest with one)"
            elif threads.chosen is not None:
                intra_threads = threads.chosen[0]
                self.threads_said = f"threads: {threads.chosen[0]} ({threads.chosen[1]})"
        self.intra_threads = intra_threads  # 0: CTranslate2's own count
        try:
            self.translator = ctranslate2.Translator(str(model_dir), device=device, device_index=device_index,
                                                     compute_type=compute_type, intra_threads=intra_threads,
                                                     inter_threads=threads.inter)
        except (RuntimeError, ValueError) as e:
            raise MtkitError(f"{model_dir}: CTranslate2 could not load the model: {e}") from None
        source = manifest.get("checkpoint")
        if source and manifest.get("step") is not None:
            source += f" (step {manifest['step']})"
        self.description = f"{model_dir} (CTranslate2" + (f", exported from {source})" if source else ")")
        self._tgt_id = {p: i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size)))}
        alignment = manifest.get("alignment")  # what return_attention gives (mtkit.export.ctranslate2.alignment_of)
        self.exported_alignment = None if alignment is None else (alignment["layer"], alignment["head"])
        # an export that declares no alignment head (an older mtkit's, another tool's) gives no alignments
        self.decoder_layers = (manifest.get("model") or {}).get("decoder_layers") if alignment is not None else None
        if self.exported_alignment is not None and self.exported_alignment[1] is not None:
            self.guided = self.exported_alignment
        self._eos = vocab.tgt_pieces([EOS_ID])[0]

    def search_batch(self, batch: list[list[int]], call: Call,
                     suppress: list[list[str]] | None = None) -> list[list[tuple[list[int], float, float]]]:
        """As the pipeline's; ``suppress``: piece sequences CTranslate2 must not write (exclude constraints)."""
        d = call.decode
        source = [call.vocab.src_pieces(ids[:-1]) for ids in batch]  # CTranslate2 appends EOS itself
        limits = [self.max_length(len(ids), d) for ids in batch]
        # One maximum per call: first the batch's largest (plus the step where mtkit forces EOS) ...
        found: list[list[tuple[list[int], float, bool]]] = [[] for _ in batch]
        free = [i for i in range(len(batch)) if limits[i] > d.min_len]  # min_len >= limit: known to reach it
        if free:
            for i, hyps in zip(free, self._search([source[i] for i in free], max(limits[i] for i in free) + 1, call,
                                                  suppress=suppress)):
                found[i] = hyps
        # ... then, with its own maximum, each sentence whose search reached its own limit:
        # fewer than `beam` hypotheses had finished before it, so all of them are kept this time.
        redo: dict[int, list[int]] = {}
        P = len(decoder_prefix(call.vocab))  # forced tokens (NLLB's target code): counted in the lengths
        for i, hyps in enumerate(found):
            if not hyps or any(P + len(ids) >= limits[i] for ids, _, _ in hyps):
                redo.setdefault(limits[i], []).append(i)
        for limit, rows in redo.items():
            again = self._search([source[i] for i in rows], limit, call, keep_all=True, suppress=suppress)
            self._add_forced_eos([source[i] for i in rows], again, call)
            for i, hyps in zip(rows, again):
                # mtkit's beam keeps the first `beam` to finish: by step, then by log-probability.
                found[i] = hyps if d.sampling else sorted(hyps, key=lambda h: (len(h[0]), -h[1]))[: d.beam]
        out = []
        for hyps in found:
            scored = [(ids, logprob / length_penalty(P + len(ids) + 1, d.alpha, d.length_penalty), logprob)
                      for ids, logprob, _ in hyps]
            scored.sort(key=lambda h: -h[1])
            out.append(scored[: d.nbest])
        return out

    def attention_batch(self, sources: list[list[int]], outputs: list[list[int]], call: Call, layer: int,
                        head: int | None) -> list:
        """As the pipeline's: the output forced as a target prefix, with ``return_attention``, which gives the
        (layer, head) the export declared (:func:`mtkit.export.ctranslate2.alignment_of`); another is an error."""
        if (layer, head) != self.exported_alignment:
            kept, kept_head = self.exported_alignment
            which = f"layer {kept}" + (f", head {kept_head}" if kept_head is not None else "'s mean of heads")
            raise MtkitError(f"--alignment-layer {layer}: this CTranslate2 export aligns with {which}, "
                             "fixed at export (CTranslate2's alignment_layer); drop the flag or use --engine torch")
        start = self._start_piece(call.vocab)
        prefixes = [start + call.vocab.tgt_pieces(ids) for ids in outputs]
        results = self.translator.translate_batch(
            [call.vocab.src_pieces(ids[:-1]) for ids in sources], target_prefix=prefixes, beam_size=1,
            max_decoding_length=max(len(p) for p in prefixes) + 1, return_attention=True, max_input_length=0,
            max_batch_size=0)
        found = []
        for src, ids, result in zip(sources, outputs, results, strict=True):
            # (steps, S - 1): a row per decoded token, a column per source piece (CTranslate2 leaves out the EOS
            # it appends); EOS's column 0, as word_alignment leaves it out
            rows = np.asarray(result.attention[0], dtype=np.float32)[len(start) : len(start) + len(ids)]
            found.append(np.pad(rows[:, : len(src) - 1], ((0, 0), (0, 1))))
        return found

    def search_constrained_batch(self, batch: list[list[int]], constraints: list[PieceConstraints | None],
                                 call: Call) -> list[list[tuple[list[int], float, float]]]:
        """Exclude constraints only, through CTranslate2's ``suppress_sequences``, which holds for a
        whole call: the batch is searched once per distinct set of excluded phrases. Include
        constraints (and glossaries) are an error: CTranslate2 has no constrained search."""
        if any(c is not None and c.include for c in constraints):
            raise MtkitError(INCLUDE_UNSUPPORTED)
        groups: dict[tuple, list[int]] = {}
        for i, c in enumerate(constraints):
            groups.setdefault(c.exclude if c else (), []).append(i)
        results: list[list[tuple[list[int], float, float]]] = [[] for _ in batch]
        for exclude, rows in groups.items():
            suppress = [call.vocab.tgt_pieces(p) for p in exclude] or None
            for i, hyps in zip(rows, self.search_batch([batch[i] for i in rows], call, suppress)):
                results[i] = hyps
        return results

    def _check_vmap(self) -> bool:
        """True when the model has a vocabulary map; else the one-line error of ``--shortlist``."""
        if not self.vmap.is_file():
            raise MtkitError(f"--shortlist: {self.vmap.parent} has no {VMAP_FILE}; build the run's shortlist with: "
                             "mtkit shortlist RUN (the export ships it)")
        return True

    def max_length(self, src_len: int, d: DecodeConfig) -> int:
        """mtkit's maximum number of output tokens before EOS for a source of ``src_len`` ids (with EOS)."""
        limit = max(1, int(d.max_len_a * src_len + d.max_len_b))
        return limit if self.max_out_len is None else max(1, min(limit, self.max_out_len))

    def _search(self, source: list[list[str]], max_steps: int, call: Call, keep_all: bool = False,
                suppress: list[list[str]] | None = None) -> list[list[tuple[list[int], float, bool]]]:
        """Per sentence, (ids without EOS, log-probability, ended with EOS) of the hypotheses CTranslate2
        finds in at most ``max_steps`` steps (the EOS step included): the ``beam`` best, or with
        ``keep_all`` every finished one (for a search known to run to its last step with fewer than
        ``beam`` finished before it: a patience of 2 neither stops it earlier nor drops any)."""
        d = call.decode
        # A non-zero penalty also turns off CTranslate2's early exit (stop when the best live
        # hypothesis ends), so the beam stops, as mtkit's, once it holds `beam` finished hypotheses.
        penalty = 0.0 if d.sampling else d.alpha or 1e-6
        options = dict(max_decoding_length=max_steps, min_decoding_length=min(d.min_len, max_steps),
                       max_input_length=0, no_repeat_ngram_size=d.no_repeat_ngram_size, return_scores=True,
                       return_end_token=True, length_penalty=penalty, max_batch_size=0)
        if suppress:  # exclude constraints (search_constrained_batch)
            options["suppress_sequences"] = suppress
        if d.shortlist:  # CTranslate2's vocabulary map (the export's vmap.txt): one shortlist per batch
            options["use_vmap"] = self._check_vmap()
        start = self._start_piece(call.vocab)
        P = len(decoder_prefix(call.vocab))  # CTranslate2 returns the forced prefix: left out below
        if d.sampling:
            if d.epsilon > 0:
                raise MtkitError(f"epsilon sampling (--epsilon) needs the {TORCH.name} engine: "
                                 f"{self.capabilities.title} samples from the top k or the nucleus only")
            n = d.nbest
            if start:
                options["target_prefix"] = [start] * (len(source) * n)
            results = self.translator.translate_batch(
                [s for s in source for _ in range(n)], beam_size=1, sampling_topk=d.top_k, sampling_topp=d.top_p,
                sampling_temperature=d.temperature, **options)
            grouped = [[h for r in results[i * n : (i + 1) * n] for h in zip(r.hypotheses, r.scores)]
                       for i in range(len(source))]
        else:
            wide = keep_all and d.beam > 1
            if start:
                options["target_prefix"] = [start] * len(source)
            results = self.translator.translate_batch(source, beam_size=d.beam, patience=2 if wide else 1,
                                                      num_hypotheses=2 * d.beam if wide else d.beam, **options)
            grouped = [list(zip(r.hypotheses, r.scores)) for r in results]
        found = []
        for hyps in grouped:
            sentence = []
            for tokens, score in hyps:
                ended = bool(tokens) and tokens[-1] == self._eos
                logprob = score * len(tokens) ** penalty if penalty else score  # undo CTranslate2's normalization
                ids = [self._tgt_id.get(t, UNK_ID) for t in (tokens[P:-1] if ended else tokens[P:])]
                sentence.append((ids, logprob, ended))
            found.append(sentence)
        return found

    def _start_piece(self, vocab) -> list[str]:
        """``[tag]`` for a multilingual model with its tags on the target side (exported without a fixed
        start token: the target prefix's first token is the start, left out of the results); an NLLB model's
        forced target code (after the fixed start, and returned in the results); else []."""
        start = decoder_start(vocab)
        return ([] if start is None else vocab.tgt_pieces([start])) + vocab.tgt_pieces(list(decoder_prefix(vocab)))

    def _add_forced_eos(self, source: list[list[str]], found: list[list[tuple[list[int], float, bool]]],
                        call: Call) -> None:
        """Give each hypothesis cut at the maximum length the EOS that mtkit forces there, with its log-probability."""
        cut = [(i, k) for i, hyps in enumerate(found) for k, (_, _, ended) in enumerate(hyps) if not ended]
        if not cut:
            return
        start = self._start_piece(call.vocab)
        scored = self.translator.score_batch([source[i] for i, _ in cut],
                                             [start + call.vocab.tgt_pieces(found[i][k][0]) for i, k in cut],
                                             max_input_length=0, max_batch_size=0)
        for (i, k), result in zip(cut, scored):
            ids, logprob, _ = found[i][k]
            eos = result.log_probs[-1] if call.decode.forced_eos == "logprob" else 0.0
            found[i][k] = (ids, logprob + eos, True)
