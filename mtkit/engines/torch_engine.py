"""mtkit's own engine: :mod:`mtkit.decoding` on one model, or an ensemble of models sharing one vocabulary.

No torch at load time (it is imported when a :class:`TorchEngine` is built), so that importing
the runtime never loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mtkit.config import BOS_ID, DecodeConfig
from mtkit.data.word_alignment import guided_head
from mtkit.engines.engine import Call, Engine, Stopped, stderr
from mtkit.errors import MtkitError


@contextmanager
def stoppable() -> Iterator[None]:
    """Search's :class:`~mtkit.decoding.options.SearchStopped` as the pipeline's :class:`Stopped`."""
    from mtkit.decoding.options import SearchStopped

    try:
        yield
    except SearchStopped as e:
        raise Stopped(str(e)) from None


def padded_sources(batch: list[list[int]]):
    """Source ids (each ending in EOS) as one (B, S) CPU tensor, padded with PAD."""
    import torch

    from mtkit.config import PAD_ID

    src = torch.full((len(batch), max(len(ids) for ids in batch)), PAD_ID, dtype=torch.long)
    for row, ids in enumerate(batch):
        src[row, : len(ids)] = torch.tensor(ids)
    return src


def run_search(model, src, options, generator=None, kernels="auto") -> list[list[tuple[list[int], float, float]]]:
    """mtkit's search on ``model`` (the protocol of :mod:`mtkit.decoding.options`) for ``src`` (B, S):
    sampling (``nbest`` samples a sentence), greedy search, or beam search, as ``options`` say; per sentence
    its (target ids, score, log-probability) triples, best first. The torch and ONNX engines' one search."""
    import torch

    from mtkit.decoding import search

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
        device: ``cpu``, ``cuda`` or ``cuda:N``; the models are moved there.
        precision: ``fp32``, or ``bf16``/``fp16`` under autocast (fp16 needs CUDA).
        seed: the sampling seed (the same input and batch give the same samples).
        min_len: EOS is banned before this many output tokens (0: never; benchmarks force lengths with it).
        languages, tag_side, target, threads: a multilingual model's pairs, tag side and default target,
            and the policy fitting the CPU threads between batches (:class:`mtkit.engines.engine.Engine`).
    """

    def __init__(self, models, decode: DecodeConfig, device: str = "cpu", precision: str = "fp32",
                 seed: int = 1, log: Callable[[str], None] = stderr, min_len: int = 0,
                 languages: tuple[list, tuple[str, str] | None] = ([], None), tag_side: str = "source",
                 target: str | None = None, threads=None) -> None:
        import torch

        from mtkit.checkpoints.io import check_one_vocabulary
        from mtkit.engines.precision import check_precision

        loaded = list(models) if isinstance(models, (list, tuple)) else [models]
        if not loaded:
            raise MtkitError("no model to translate with")
        first = loaded[0]
        check_one_vocabulary(loaded)
        self.device = torch.device(device)
        check_precision(precision, self.device.type, "precision")
        max_positions = min(getattr(getattr(m.model, "cfg", None), "max_positions", 1 << 30) for m in loaded)
        super().__init__(first.vocab, decode, max_positions, log, languages, tag_side, target, threads)
        self.precision = precision
        self.min_len = min_len
        self.models = [m.model.to(self.device).eval() for m in loaded]
        self.seed = seed
        self.decoder_layers = self.models[0].cfg.decoder_layers
        self.guided = guided_head(getattr(first, "config", None))
        from mtkit.engines.inference import InferenceModel

        # What search decodes with: each model's weights packed once, here, and owned by this engine.
        inference = [InferenceModel(m) for m in self.models]
        if len(inference) == 1:
            self.model = inference[0]
        else:
            from mtkit.decoding.ensemble import Ensemble

            self.model = Ensemble(inference)

    def call(self, options: DecodeConfig | None = None, target: str | None = None) -> Call:
        """As the pipeline's, with a random generator of its own seeded with ``seed`` when it samples
        (so that a call's samples depend on its input alone, whatever other threads do)."""
        import dataclasses

        import torch

        found = super().call(options, target)
        if not found.decode.sampling:
            return found
        return dataclasses.replace(found, generator=torch.Generator(device=self.device).manual_seed(self.seed))

    def search_constrained_batch(self, batch, constraints, call: Call):
        """Lexically constrained decoding: see :mod:`mtkit.engines.torch_constrained`."""
        from mtkit.engines.torch_constrained import search_constrained_batch

        return search_constrained_batch(self, batch, constraints, call)

    def source_tensor(self, batch: list[list[int]]):
        """Source ids (each ending in EOS) as one (B, S) tensor on the engine's device, padded with PAD."""
        return padded_sources(batch).to(self.device)

    def search_options(self, call: Call):
        """The :class:`~mtkit.decoding.options.SearchOptions` of a call: its decode settings, capped by the
        model's position table, the engine's ``min_len``, and the call's decoder start (a target-side tag)."""
        from mtkit.data.languages import decoder_start
        from mtkit.decoding.options import SearchOptions

        return SearchOptions.from_decode(call.decode, max_len_limit=self.max_out_len, min_len=self.min_len,
                                         start=decoder_start(call.vocab), should_stop=call.should_stop)

    def search_batch(self, batch: list[list[int]], call: Call) -> list[list[tuple[list[int], float, float]]]:
        from mtkit.engines.precision import autocast

        with autocast(self.precision, self.device.type):
            return run_search(self.model, self.source_tensor(batch), self.search_options(call), call.generator,
                              self.models[0].kernels)

    def attention_batch(self, sources: list[list[int]], outputs: list[list[int]], call: Call, layer: int,
                        head: int | None) -> list:
        """As the pipeline's: one teacher-forced pass of the (first) model through the reference attention,
        up to ``layer``."""
        import torch

        from mtkit.data.languages import decoder_start
        from mtkit.engines.precision import autocast

        start = decoder_start(call.vocab)
        tgt = padded_sources([[BOS_ID if start is None else start, *ids] for ids in outputs]).to(self.device)
        with torch.inference_mode(), autocast(self.precision, self.device.type):
            maps = self.models[0].cross_attention(self.source_tensor(sources), tgt, layer + 1)[layer]  # (B, h, T, S)
        maps = (maps.mean(dim=1) if head is None else maps[:, head]).float().cpu().numpy()
        return [maps[b, : len(ids), : len(src)] for b, (src, ids) in enumerate(zip(sources, outputs, strict=True))]
