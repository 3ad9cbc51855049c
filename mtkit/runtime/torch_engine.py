"""mtkit's own engine: :mod:`mtkit.search` on one model, or an ensemble of models sharing one vocabulary.

No torch at load time (it is imported when a :class:`Translator` is built), so that importing
the runtime never loads it.
"""

from __future__ import annotations

from collections.abc import Callable

from mtkit.config import DecodeConfig
from mtkit.errors import MtkitError
from mtkit.runtime.engine import LineTranslator, _stderr


class Translator(LineTranslator):
    """mtkit's own engine: one model, or an ensemble of models sharing one vocabulary.

    Built, it packs each model's weights for inference (:class:`mtkit.runtime.inference.InferenceModel`,
    ``model``: what search decodes with) and is never changed after: a model trained further needs a new
    engine (validation BLEU builds one per validation).

    Args:
        models: a LoadedModel-like (``.model``, ``.vocab``) or a list of them (an ensemble).
        decode: the decoding settings (beam, alpha, lengths, sampling ...).
        device: ``cpu``, ``cuda`` or ``cuda:N``; the models are moved there.
        precision: ``fp32``, or ``bf16``/``fp16`` under autocast (fp16 needs CUDA).
        seed: the sampling seed (the same input and batch give the same samples).
        min_len: EOS is banned before this many output tokens (0: never; benchmarks force lengths with it).
    """

    def __init__(self, models, decode: DecodeConfig, device: str = "cpu", precision: str = "fp32",
                 seed: int = 1, log: Callable[[str], None] = _stderr, min_len: int = 0) -> None:
        import torch

        from mtkit.runtime.ensemble import check_one_vocabulary
        from mtkit.runtime.precision import check_precision

        loaded = list(models) if isinstance(models, (list, tuple)) else [models]
        if not loaded:
            raise MtkitError("no model to translate with")
        first = loaded[0]
        check_one_vocabulary(loaded)
        self.device = torch.device(device)
        check_precision(precision, self.device.type, "precision")
        max_positions = min(getattr(getattr(m.model, "cfg", None), "max_positions", 1 << 30) for m in loaded)
        super().__init__(first.vocab, decode, max_positions, log)
        self.precision = precision
        self.min_len = min_len
        self.models = [m.model.to(self.device).eval() for m in loaded]
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        from mtkit.runtime.inference import InferenceModel

        # What search decodes with: each model's weights packed once, here, and owned by this engine.
        inference = [InferenceModel(m) for m in self.models]
        if len(inference) == 1:
            self.model = inference[0]
        else:
            from mtkit.runtime.ensemble import Ensemble

            self.model = Ensemble(inference)

    def search_constrained_batch(self, batch, constraints):
        """Lexically constrained decoding: see :mod:`mtkit.runtime.torch_constrained`."""
        from mtkit.runtime.torch_constrained import search_constrained_batch

        return search_constrained_batch(self, batch, constraints)

    def source_tensor(self, batch: list[list[int]]):
        """Source ids (each ending in EOS) as one (B, S) tensor on the engine's device, padded with PAD."""
        import torch

        from mtkit.config import PAD_ID

        src = torch.full((len(batch), max(len(ids) for ids in batch)), PAD_ID, dtype=torch.long)
        for row, ids in enumerate(batch):
            src[row, : len(ids)] = torch.tensor(ids)
        return src.to(self.device)

    def search_batch(self, batch: list[list[int]]) -> list[list[tuple[list[int], float]]]:
        import torch

        from mtkit import search
        from mtkit.data.languages import decoder_start
        from mtkit.runtime.precision import autocast

        d = self.decode
        src = self.source_tensor(batch)
        common = dict(max_len_a=d.max_len_a, max_len_b=d.max_len_b, alpha=d.alpha, penalty=d.length_penalty,
                      no_repeat_ngram_size=d.no_repeat_ngram_size, max_len_limit=self.max_out_len,
                      min_len=self.min_len, forced_eos=d.forced_eos, start=decoder_start(self.vocab))
        with torch.inference_mode(), autocast(self.precision, self.device.type):
            if d.sampling:
                n = d.nbest
                found = search.sample(self.model, src.repeat_interleave(n, dim=0), d.temperature, d.top_k,
                                      d.top_p, self.generator, **common)
                hyps = [sorted((h for s in found[i * n : (i + 1) * n] for h in s), key=lambda h: -h.score)
                        for i in range(len(batch))]
            elif d.beam == 1:
                hyps = search.greedy_search(self.model, src, **common)
            else:
                hyps = search.beam_search(self.model, src, beam=d.beam, nbest=d.nbest, kernels=self.models[0].kernels,
                                          **common)
        return [[(h.tokens, h.score) for h in sentence] for sentence in hyps]
