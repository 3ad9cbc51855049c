"""The torch engine's constrained decoding: a batch whose sentences carry constraints, searched with
:func:`mtkit.decoding.constrained.constrained_beam_search` under the engine's settings.

The sentences without constraints are searched apart, by the engine's own
:meth:`~mtkit.engines.torch_engine.TorchEngine.search_batch` (so they translate exactly as in a batch
without constraints, however that search evolves); those with constraints go to the constrained
search, with beam 1 too (DBA needs candidates beyond the single best). Sampling takes no constraints.
"""

from __future__ import annotations

from mtkit.engines.constraints import PieceConstraints
from mtkit.errors import MtkitError


def search_constrained_batch(translator, batch: list[list[int]], constraints: list[PieceConstraints | None],
                             call) -> list[list[tuple[list[int], float]]]:
    """Per sentence of ``batch`` (source ids ending in EOS), its (target ids, score) pairs, best first.

    Args:
        translator: a :class:`mtkit.engines.torch_engine.TorchEngine` (its model, device, precision,
            search options of the call, from :meth:`~mtkit.engines.torch_engine.TorchEngine.search_options`).
        constraints: per sentence, its encoded constraints (None: none).
        call: the call's settings and vocabulary (:class:`mtkit.engines.engine.Call`).
    """
    import torch

    from mtkit.decoding.constrained import constrained_beam_search
    from mtkit.engines.precision import autocast
    from mtkit.engines.torch_engine import stoppable

    options = translator.search_options(call)
    if options.sampling:
        raise MtkitError("constraints and glossaries need beam search: drop --sampling")
    plain = [i for i, c in enumerate(constraints) if not c]
    forced = [i for i, c in enumerate(constraints) if c]
    results: list[list[tuple[list[int], float, float]]] = [[] for _ in batch]
    if plain:
        for i, hyps in zip(plain, translator.search_batch([batch[i] for i in plain], call)):
            results[i] = hyps
    if not forced:
        return results
    src = translator.source_tensor([batch[i] for i in forced])
    with stoppable(), torch.inference_mode(), autocast(translator.precision, translator.device.type):
        found = constrained_beam_search(
            translator.model, src, [constraints[i].include for i in forced], [constraints[i].exclude for i in forced],
            options, kernels=getattr(translator.models[0], "kernels", "auto"))
    for i, hyps in zip(forced, found):
        results[i] = [(h.tokens, h.score, h.logprob) for h in hyps]
    return results
