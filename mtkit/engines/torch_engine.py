"""mtkit's own engine: :mod:`mtkit.decoding` on one model, or an ensemble of models sharing one vocabulary,
with its constrained decoding (constraints, glossaries) as one more search of the engine.

The lines without constraints of a batch that has some are searched apart, by the engine's own
:meth:`TorchEngine.search_batch` (so they translate exactly as in a batch without constraints, however that
search evolves); those with constraints go to :func:`mtkit.decoding.constrained.constrained_beam_search`,
with beam 1 too (DBA needs candidates beyond the single best). Sampling takes no constraints.

Torch is imported at load time: the factory imports this module only to build a torch engine (the
CTranslate2 path never loads it).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from mtkit.checkpoints.io import check_one_vocabulary
from mtkit.config import BOS_ID, PAD_ID, DecodeConfig
from mtkit.data.languages import decoder_prefix, decoder_start
from mtkit.data.word_alignment import guided_head
from mtkit.decoding import search
from mtkit.decoding.constrained import constrained_beam_search
from mtkit.decoding.ensemble import Ensemble
from mtkit.decoding.options import SearchOptions, SearchStopped
from mtkit.decoding.shortlist import Shortlisted
from mtkit.engines.capabilities import TORCH
from mtkit.engines.constraints import PieceConstraints
from mtkit.engines.engine import Call, Engine, EngineOptions, Stopped
from mtkit.engines.inference import InferenceModel
from mtkit.engines.precision import autocast, check_precision
from mtkit.errors import MtkitError
from mtkit.shortlist import SHORTLIST_FILE, Shortlist, read_shortlist
from mtkit.shortlist import describe as describe_shortlist

logger = logging.getLogger(__name__)


@contextmanager
def stoppable() -> Iterator[None]:
    """Search's :class:`~mtkit.decoding.options.SearchStopped` as the pipeline's :class:`Stopped`."""
    try:
        yield
    except SearchStopped as e:
        raise Stopped(str(e)) from None


def padded_sources(batch: list[list[int]]):
    """Source ids (each ending in EOS) as one (B, S) CPU tensor, padded with PAD."""
    src = torch.full((len(batch), max(len(ids) for ids in batch)), PAD_ID, dtype=torch.long)
    for row, ids in enumerate(batch):
        src[row, : len(ids)] = torch.tensor(ids)
    return src


def run_search(model, src, options, generator=None, kernels="auto") -> list[list[tuple[list[int], float, float]]]:
    """mtkit's search on ``model`` (the protocol of :mod:`mtkit.decoding.options`) for ``src`` (B, S):
    sampling (``nbest`` samples a sentence), greedy search, or beam search, as ``options`` say; per sentence
    its (target ids, score, log-probability) triples, best first. The torch and ONNX engines' one search."""
    with stoppable(), torch.inference_mode():
        if options.sampling:
            n = options.nbest
            found = search.sample(model, src.repeat_interleave(n, dim=0), options, generator)
            hyps = [sorted((h for s in found[i * n : (i + 1) * n] for h in s), key=lambda h: -h.score)
                    for i in range(src.size(0))]
        elif options.beam == 1:
            hyps = search.greedy_search(model, src, options)
        else:
            hyps = search.beam_search(model, src, options, kernels=kernels)
    return [[(h.tokens, h.score, h.logprob) for h in sentence] for sentence in hyps]


class TorchEngine(Engine):
    """mtkit's own engine: one model, or an ensemble of models sharing one vocabulary.

    Built, it packs each model's weights for inference (:class:`mtkit.engines.inference.InferenceModel`,
    ``model``: what search decodes with) and is never changed after: a model trained further needs a new
    engine (validation BLEU builds one per validation).

    Args:
        models: a LoadedModel-like (``.model``, ``.vocab``) or a list of them (an ensemble).
        decode: the decoding settings (beam, alpha, lengths, sampling ...).
        options: the device (the models are moved there), the precision (``fp32``, or ``bf16``/``fp16``
            under autocast; fp16 needs CUDA), the sampling seed and whether it warns
            (:class:`mtkit.engines.engine.EngineOptions`).
        languages, tag_side, target, threads: a multilingual model's pairs, tag side and default target,
            and the policy fitting the CPU threads between batches (:class:`mtkit.engines.engine.Engine`).
        shortlist: the run's vocabulary shortlist (:class:`mtkit.shortlist.Shortlist`), or its file, read when
            the engine is built with ``decode.shortlist`` or at the first call that asks for it (once: a run
            that has one costs no start-up when it is not used); None: the run has none.
    """

    capabilities = TORCH

    def __init__(self, models, decode: DecodeConfig, options: EngineOptions = EngineOptions(),
                 languages: tuple[list, tuple[str, str] | None] = ([], None), tag_side: str = "source",
                 target: str | None = None, threads=None, shortlist=None) -> None:
        loaded = list(models) if isinstance(models, (list, tuple)) else [models]
        if not loaded:
            raise MtkitError("no model to translate with")
        first = loaded[0]
        check_one_vocabulary(loaded)
        self.device = torch.device(options.device)
        check_precision(options.precision, self.device.type, "precision")
        max_positions = min(getattr(getattr(m.model, "cfg", None), "max_positions", 1 << 30) for m in loaded)
        super().__init__(first.vocab, decode, max_positions, languages, tag_side, target, threads)
        self.warn = options.warn
        self.precision = options.precision
        self.seed = options.seed
        self.models = [m.model.to(self.device).eval() for m in loaded]
        self.decoder_layers = self.models[0].cfg.decoder_layers
        self.guided = guided_head(getattr(first, "config", None))
        # What search decodes with: each model's weights packed once, here, and owned by this engine.
        inference = [InferenceModel(m) for m in self.models]
        self.model = inference[0] if len(inference) == 1 else Ensemble(inference)
        self._shortlist = shortlist
        self._shortlist_lock = threading.Lock()
        if decode.shortlist:
            self.shortlist  # noqa: B018 - read (and checked) now, as the engine's settings ask for it

    @property
    def shortlist(self) -> Shortlist:
        """The run's shortlist, its file read on first use; a one-line error when the run has none."""
        with self._shortlist_lock:
            if self._shortlist is None:
                raise MtkitError(f"--shortlist: the run has no {SHORTLIST_FILE}; build it with: mtkit shortlist RUN")
            if not isinstance(self._shortlist, Shortlist):
                found = read_shortlist(self._shortlist, self.vocab)
                logger.info(f"shortlist {self._shortlist}: {describe_shortlist(found)}")
                self._shortlist = found
            return self._shortlist

    def call(self, options: DecodeConfig | None = None, target: str | None = None) -> Call:
        """As the pipeline's, with a random generator of its own seeded with ``seed`` when it samples
        (so that a call's samples depend on its input alone, whatever other threads do)."""
        found = super().call(options, target)
        if not found.decode.sampling:
            return found
        return dataclasses.replace(found, generator=torch.Generator(device=self.device).manual_seed(self.seed))

    def source_tensor(self, batch: list[list[int]]):
        """Source ids (each ending in EOS) as one (B, S) tensor on the engine's device, padded with PAD."""
        return padded_sources(batch).to(self.device)

    def search_options(self, call: Call) -> SearchOptions:
        """The :class:`~mtkit.decoding.options.SearchOptions` of a call: its decode settings, capped by the
        model's position table, and the call's decoder start (a target-side tag)."""
        return SearchOptions.from_decode(call.decode, max_len_limit=self.max_out_len,
                                         start=decoder_start(call.vocab), prefix=decoder_prefix(call.vocab),
                                         should_stop=call.should_stop)

    def search_batch(self, batch: list[list[int]], call: Call) -> list[list[tuple[list[int], float, float]]]:
        options = self.search_options(call)
        src = self.source_tensor(batch)
        if not call.decode.shortlist:
            with autocast(self.precision, self.device.type):
                return run_search(self.model, src, options, call.generator, self.models[0].kernels)
        short = self.shortlisted(batch, options)
        with autocast(self.precision, self.device.type):
            found = run_search(short.model, src, short.options, call.generator, self.models[0].kernels)
        rows = options.nbest if options.sampling else 1  # sampling searches nbest rows a sentence
        return [[(short.ids(i * rows, tokens), score, logprob) for tokens, score, logprob in hyps]
                for i, hyps in enumerate(found)]

    def shortlisted(self, batch: list[list[int]], options: SearchOptions) -> Shortlisted:
        """A search of ``batch`` over each sentence's shortlist (:mod:`mtkit.decoding.shortlist`): the ids
        :meth:`mtkit.shortlist.Shortlist.allowed` gives its sources, with the call's decoder start and prefix;
        as many rows as search decodes (sampling draws ``nbest`` samples a sentence)."""
        allowed = torch.from_numpy(self.shortlist.mask(batch, (options.start, *options.prefix)))  # (B, V)
        if options.sampling and options.nbest > 1:
            allowed = allowed.repeat_interleave(options.nbest, dim=0)
        return Shortlisted(self.model, allowed.to(self.device), options)

    def search_constrained_batch(self, batch: list[list[int]], constraints: list[PieceConstraints | None],
                                 call: Call) -> list[list[tuple[list[int], float, float]]]:
        """Lexically constrained decoding (see the module docstring): per sentence of ``batch`` (source ids
        ending in EOS) with its encoded constraints (None: none), its (target ids, score, log-probability)
        triples, best first."""
        options = self.search_options(call)
        if options.sampling:
            raise MtkitError("constraints and glossaries need beam search: drop --sampling")
        plain = [i for i, c in enumerate(constraints) if not c]
        forced = [i for i, c in enumerate(constraints) if c]
        results: list[list[tuple[list[int], float, float]]] = [[] for _ in batch]
        if plain:
            for i, hyps in zip(plain, self.search_batch([batch[i] for i in plain], call)):
                results[i] = hyps
        if not forced:
            return results
        src = self.source_tensor([batch[i] for i in forced])
        with stoppable(), torch.inference_mode(), autocast(self.precision, self.device.type):
            found = constrained_beam_search(
                self.model, src, [constraints[i].include for i in forced], [constraints[i].exclude for i in forced],
                options, kernels=getattr(self.models[0], "kernels", "auto"))
        for i, hyps in zip(forced, found):
            results[i] = [(h.tokens, h.score, h.logprob) for h in hyps]
        return results

    def attention_batch(self, sources: list[list[int]], outputs: list[list[int]], call: Call, layer: int,
                        head: int | None) -> list:
        """As the pipeline's: one teacher-forced pass of the (first) model through the reference attention,
        up to ``layer``."""
        start, prefix = decoder_start(call.vocab), decoder_prefix(call.vocab)
        tgt = padded_sources([[BOS_ID if start is None else start, *prefix, *ids] for ids in outputs]).to(self.device)
        with torch.inference_mode(), autocast(self.precision, self.device.type):
            maps = self.models[0].cross_attention(self.source_tensor(sources), tgt, layer + 1)[layer]  # (B, h, T, S)
        maps = (maps.mean(dim=1) if head is None else maps[:, head]).float().cpu().numpy()
        P = len(prefix)  # the rows that predict the forced prefix are not the output's
        return [maps[b, P : P + len(ids), : len(src)]
                for b, (src, ids) in enumerate(zip(sources, outputs, strict=True))]
