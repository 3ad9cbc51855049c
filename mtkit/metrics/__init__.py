"""Metrics: sacreBLEU scores with signatures and the paired bootstrap (:mod:`.scores`), tokenized
BLEU as papers quote it (:mod:`.tokenized`), named test sets (:mod:`.testsets`), and hypothesis files
scored against reference files (:mod:`.files`)."""

from mtkit.metrics.scores import (
    COMPOUND_NAME,
    LC_TOK_NAME,
    METRICS,
    BleuScore,
    BootstrapScore,
    ChrfScore,
    MetricOptions,
    MetricScore,
    TerScore,
    load_pairs_refs,
    paired_bootstrap,
    score,
)
from mtkit.metrics.testsets import _cached, load_testset
from mtkit.metrics.tokenized import compound_split_tok, lc_tok, looks_lc_tok

__all__ = [
    "COMPOUND_NAME", "LC_TOK_NAME", "METRICS", "BleuScore", "BootstrapScore", "ChrfScore", "MetricOptions",
    "MetricScore", "TerScore", "_cached", "compound_split_tok", "lc_tok", "load_pairs_refs", "load_testset",
    "looks_lc_tok", "paired_bootstrap", "score",
]
