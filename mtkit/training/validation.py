"""Validation: the loss, NLL and perplexity on the validation store, and BLEU (and chrF, COMET with
``train.valid_metrics``) of the model's translations of the validation sources against the raw references;
per pair for a multilingual run."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu
import torch

from mtkit.api import from_model
from mtkit.config import DecodeConfig
from mtkit.data.languages import TaggedVocab
from mtkit.engines.precision import autocast
from mtkit.io import read_lines
from mtkit.training import distributed
from mtkit.training.batching import collate, make_batches
from mtkit.training.distributed import DistContext, all_gather_objects
from mtkit.training.loss import perplexity


@dataclass(frozen=True)
class Scoring:
    """What validation scores its translations with, and which of them this process takes.

    Attributes:
        metrics: ``bleu`` (always), ``chrf``: detokenized sacreBLEU, cased, or case-insensitive when the
            target vocabulary lowercases (``data.spm.lowercase``); ``comet``: the mean COMET of ``comet``.
        comet: a :class:`~mtkit.metrics.comet.CometScorer`, with ``comet`` in ``metrics``.
        dist: with several ranks, each translates (and COMET-scores) every ``world_size``-th sentence from
            ``rank`` on, and what they found is gathered so that every rank scores the whole set (and gets the
            same figures).
    """

    metrics: tuple[str, ...] = ("bleu",)
    comet: Any = None
    dist: DistContext = field(default_factory=DistContext)


def validation_bleu(model, vocab, data_dir: Path, decode: DecodeConfig, device, scoring: Scoring | None = None,
                    lines: tuple[int, int] | None = None) -> float:
    """Detokenized sacreBLEU of ``model`` on ``data_dir``'s valid split (:func:`validation_scores`)."""
    return validation_scores(model, vocab, data_dir, decode, device, lines, scoring)["bleu"]


def validation_scores(model, vocab, data_dir: Path, decode: DecodeConfig, device,
                      lines: tuple[int, int] | None = None, scoring: Scoring | None = None) -> dict[str, float]:
    """The metrics of ``scoring`` (:class:`Scoring`: BLEU by default) of ``model``'s translations of
    ``data_dir``'s valid split (``valid.{src,tgt}.txt``), by name, translated with ``decode`` (its beam; one
    hypothesis each).

    ``lines``: (start, end) of one pair's segment of a multilingual set (``vocab`` then leads each source
    with that pair's tag: :class:`mtkit.data.languages.TaggedVocab`)."""
    scoring = scoring or Scoring()
    metrics, comet = scoring.metrics, scoring.comet
    rank, world_size = scoring.dist.rank, scoring.dist.world_size

    sources = list(read_lines(Path(data_dir) / "valid.src.txt"))
    references = list(read_lines(Path(data_dir) / "valid.tgt.txt"))
    if lines is not None:
        sources, references = sources[lines[0] : lines[1]], references[lines[0] : lines[1]]
    translator = from_model(model, vocab, replace(decode, nbest=1), str(device)).engine
    mine = translator.translate_text(sources[rank::world_size])
    segments = (comet.score(sources[rank::world_size], mine, references[rank::world_size], progress=False)
                if "comet" in metrics else [])
    shards = all_gather_objects((mine, segments))  # shard r: sentences r::world
    hypotheses = [shards[i % world_size][0][i // world_size] for i in range(len(sources))]
    lowercase = vocab.lowercases("tgt")
    scores = {"bleu": float(sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase).score)}
    if "chrf" in metrics:
        scores["chrf"] = float(sacrebleu.metrics.CHRF(lowercase=lowercase).corpus_score(hypotheses, [references]).score)
    if "comet" in metrics:
        gathered = [value for _, shard in shards for value in shard]
        scores["comet"] = sum(gathered) / len(gathered) if gathered else float("nan")
    return scores


def validation_losses(criterion, store, pairs: list, *, max_tokens: int, tagged_targets: bool, precision: str,
                      device, dist: DistContext | None = None) -> dict:
    """Loss, NLL and perplexity per target token of ``criterion`` (model + loss) on the validation
    ``store``; each rank (``dist``) takes every world_size-th batch and the sums are all-reduced, so every rank
    gets the same values. A multilingual run (``pairs``: those with a validation segment) gets them per pair
    (``valid_loss/en-de`` …) and as ``valid_loss`` / ``valid_nll`` the mean over the pairs, each pair
    counting once whatever its size (``valid_ppl``: the perplexity of that mean NLL)."""
    rank, world_size = (dist or DistContext()).rank, (dist or DistContext()).world_size
    segments = [pair.segment("valid") for pair in pairs] if pairs else [(0, len(store))]
    sums: list[float] = []
    with torch.no_grad():
        for start, count in segments:
            rows = np.arange(start, start + count)
            loss_sum = nll_sum = 0.0
            n = 0
            batches = make_batches(store.src_lengths[rows], store.tgt_lengths[rows], max_tokens, 0)
            for indices in batches[rank::world_size]:
                batch = collate(store, rows[indices], tagged_targets).to(device)
                with autocast(precision, device.type):
                    loss, nll, tokens = criterion(batch.src, batch.tgt_in, batch.tgt_out)
                loss_sum += float(loss)
                nll_sum += float(nll)
                n += tokens
            sums += [loss_sum, nll_sum, n]
    sums = distributed.all_reduce_sums(sums, device)
    if not pairs:
        loss_sum, nll_sum, n = sums
        return {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": perplexity(nll_sum / n)}
    record: dict = {}
    losses, nlls = [], []
    for k, pair in enumerate(pairs):
        loss_sum, nll_sum, n = sums[3 * k : 3 * k + 3]
        losses.append(loss_sum / max(n, 1))
        nlls.append(nll_sum / max(n, 1))
        name = pair.pair.name
        record.update({f"valid_loss/{name}": losses[-1], f"valid_nll/{name}": nlls[-1],
                       f"valid_ppl/{name}": perplexity(nlls[-1])})
    mean_nll = sum(nlls) / len(nlls)
    return {"valid_loss": sum(losses) / len(losses), "valid_nll": mean_nll, "valid_ppl": perplexity(mean_nll),
            **record}


def validation_bleus(model, vocab, data_dir: Path, decode: DecodeConfig, device, pairs: list, tag_side: str,
                     scoring: Scoring | None = None) -> dict:
    """``valid_bleu`` (and ``valid_chrf``, ``valid_comet`` when ``scoring`` has them: :func:`validation_scores`);
    for a multilingual run (``pairs``: those with a validation segment) per pair (``valid_bleu/en-de`` …), its
    sources led by the pair's tag, and their mean as ``valid_bleu``."""
    scoring = scoring or Scoring()
    if not pairs:
        found = validation_scores(model, vocab, data_dir, decode, device, None, scoring)
        return {f"valid_{name}": value for name, value in found.items()}
    record: dict = {}
    for pair in pairs:
        start, count = pair.segment("valid")
        found = validation_scores(model, TaggedVocab(vocab, pair.pair.tgt_lang, tag_side), data_dir, decode, device,
                                  (start, start + count), scoring)
        record.update({f"valid_{name}/{pair.pair.name}": value for name, value in found.items()})
    means = {f"valid_{name}": sum(v for k, v in record.items() if k.startswith(f"valid_{name}/")) / len(pairs)
             for name in scoring.metrics}
    return {**means, **record}
