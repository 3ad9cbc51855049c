"""Token-budget batches, bucketed by length, shuffled per epoch, sharded across ranks.

A batch holds as many examples of similar length as fit in ``max_tokens`` padded
tokens (the longer of the padded source and target sides, the way fairseq counts).
Examples are sorted by length after a seeded shuffle, cut into batches, and the
batches shuffled again from ``seed + epoch``; every rank builds the same list and
reads its own slice, so ranks read distinct batches without communication. The
position in an epoch is the sampler's whole state, which makes resume exact.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from mtkit.config import BOS_ID, EOS_ID, PAD_ID


class Store(Protocol):
    """What batching needs of a split (mtkit.data.store.ParallelStore has it)."""

    src_lengths: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int: ...
    def src(self, i: int) -> np.ndarray: ...
    def tgt(self, i: int) -> np.ndarray: ...


def make_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int) -> list[np.ndarray]:
    """Cut the examples into token-budget batches of similar lengths (in a seeded order).

    Lengths count the added EOS (source) and BOS/EOS (target) tokens. Examples longer
    than ``max_tokens`` on their own are left out.
    """
    src_len = src_lengths.astype(np.int64) + 1
    tgt_len = tgt_lengths.astype(np.int64) + 1
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(src_len))
    # Sort by target then source length; the permutation breaks ties at random.
    order = order[np.lexsort((src_len[order], tgt_len[order]))]
    width = np.maximum(src_len, tgt_len)[order]
    batches: list[np.ndarray] = []
    start, longest = 0, 0
    for i, w in enumerate(width):
        if w > max_tokens:
            if i > start:
                batches.append(order[start:i])
            start, longest = i + 1, 0
            continue
        longest = max(longest, w)
        if longest * (i + 1 - start) > max_tokens:
            batches.append(order[start:i])
            start, longest = i, w
    if start < len(order):
        batches.append(order[start:])
    return batches


def mixture_probabilities(sizes: Sequence[int], temperature: float = 1.0,
                          weights: Sequence[float] | None = None) -> np.ndarray:
    """Each pair's share of a multilingual training mixture: ``weights`` normalized, or temperature
    sampling over the pairs' sizes, p_i ∝ n_i^(1/T) (Arivazhagan et al. 2019; T = 1 is proportional,
    larger T flatter, towards uniform). A pair without training data gets 0."""
    n = np.asarray(sizes, dtype=np.float64)
    raw = np.asarray(weights, dtype=np.float64) if weights is not None else n ** (1.0 / temperature)
    raw = np.where(n > 0, raw, 0.0)
    return raw / raw.sum()


class PairMixture:
    """Draws one epoch of a multilingual store: from each pair's contiguous segment, its share of
    the store's size (``probs`` × N, rounded by largest remainders). A pair drawn more often than it
    has examples repeats all of them (and a random part once more); one drawn less takes a random
    subset, without repeats. Deterministic in the seed."""

    def __init__(self, segments: Sequence[tuple[int, int]], probs: Sequence[float]) -> None:
        self.segments = [(int(start), int(count)) for start, count in segments]
        total = sum(count for _, count in self.segments)
        quota = np.asarray(probs, dtype=np.float64) * total
        counts = np.floor(quota).astype(np.int64)
        for i in np.argsort(-(quota - counts), kind="stable")[: total - int(counts.sum())]:
            counts[i] += 1
        self.counts = counts  # examples drawn from each pair per epoch, (P,)

    def epoch_indices(self, seed: int) -> np.ndarray:
        """The store indices of one epoch, (sum(counts),) int64, pair after pair."""
        rng = np.random.default_rng(seed)
        parts = []
        for (start, n), k in zip(self.segments, self.counts.tolist()):
            if k == 0 or n == 0:
                continue
            full, rest = divmod(k, n)
            parts += [np.arange(start, start + n, dtype=np.int64)] * full
            parts.append(start + rng.choice(n, size=rest, replace=False).astype(np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class SamplerState:
    epoch: int = 1
    position: int = 0  # batches of this rank already consumed in this epoch


class TokenBatchSampler:
    """Yields this rank's batches of example indices, epoch after epoch, from a resumable position."""

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        mixture: PairMixture | None = None,
    ) -> None:
        self.src_lengths = src_lengths
        self.tgt_lengths = tgt_lengths
        self.max_tokens = max_tokens
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.mixture = mixture  # a multilingual store sampled in other shares than its pairs' sizes
        self.epoch_lengths: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None  # each epoch's own
        # lengths (train.augment changes them), instead of src_lengths and tgt_lengths
        self.state = SamplerState()

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches for ``epoch``; every rank gets the same number."""
        seed = self.seed + epoch if self.shuffle else self.seed
        src_lengths, tgt_lengths = self.epoch_lengths(epoch) if self.epoch_lengths is not None else \
            (self.src_lengths, self.tgt_lengths)
        if self.mixture is None:
            batches = make_batches(src_lengths, tgt_lengths, self.max_tokens, seed)
        else:
            drawn = self.mixture.epoch_indices(seed)
            batches = [drawn[b] for b in make_batches(src_lengths[drawn], tgt_lengths[drawn], self.max_tokens, seed)]
        if self.shuffle:
            perm = np.random.default_rng(self.seed * 1_000_003 + epoch).permutation(len(batches))
            batches = [batches[i] for i in perm]
        # Strided shards of equal length: the ranks stay in step, and update k of a run on
        # W ranks sees the same W batches as update k of one process with update_freq × W.
        usable = len(batches) // self.world_size * self.world_size
        return batches[:usable][self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        """Yields (epoch, batch) forever, starting at ``self.state``; updates the state as it goes."""
        while True:
            batches = self.epoch_batches(self.state.epoch)
            if not batches:
                raise ValueError("no batch fits: every example is longer than max_tokens")
            while self.state.position < len(batches):
                batch = batches[self.state.position]
                self.state = SamplerState(self.state.epoch, self.state.position + 1)
                yield self.state.epoch, batch
            self.state = SamplerState(epoch=self.state.epoch + 1, position=0)


@dataclass
class Batch:
    """Padded tensors of one batch.

    src: (B, S) source ids + EOS; tgt_in: (B, T) BOS + target ids; tgt_out: (B, T) target ids + EOS.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    epoch: int = 0
    position: int = 0  # the sampler position after this batch
    # guided alignment: (B, T, S) float32, row t the distribution over source pieces that target piece t
    # aligns with (uniform over its links), a zero row for a piece without links (and EOS, and padding)
    align: torch.Tensor | None = None

    @property
    def n_tgt_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())

    @property
    def padding_fraction(self) -> float:
        """Share of padding among all source and target cells."""
        real = int((self.src != PAD_ID).sum()) + self.n_tgt_tokens
        return 1.0 - real / (self.src.numel() + self.tgt_out.numel())

    def to(self, device: torch.device | str) -> Batch:
        nb = dict(non_blocking=True)
        return Batch(self.src.to(device, **nb), self.tgt_in.to(device, **nb), self.tgt_out.to(device, **nb),
                     self.epoch, self.position, None if self.align is None else self.align.to(device, **nb))


Resegment = Callable[[list, list], tuple[list, list]]
Augment = Callable[[Store, Sequence[int], int], tuple[list, list]]  # (store, indices, epoch) -> (srcs, tgts)
REPACK_POOL = 32  # batches whose re-segmented sentences are dealt out again together (BPE-dropout)


def pad_batch(srcs: Sequence, tgts: Sequence, tagged_targets: bool = False, links: Sequence | None = None) -> Batch:
    """Padded tensors of source and target id sequences (EOS after the source, BOS/EOS around the target).

    ``tagged_targets``: each target starts with its target-language tag (``data.tag_side: target``),
    which takes BOS's place as the decoder's first input and is never an output to predict.
    ``links``: each pair's (source piece, target piece) links, (k, 2), for guided alignment (:attr:`Batch.align`).
    """
    B = len(srcs)
    S = max(len(s) for s in srcs) + 1
    lead = 0 if tagged_targets else 1  # BOS cells before the target ids of tgt_in
    T = max(len(t) for t in tgts) + lead
    src = np.full((B, S), PAD_ID, dtype=np.int64)
    tgt_in = np.full((B, T), PAD_ID, dtype=np.int64)
    tgt_out = np.full((B, T), PAD_ID, dtype=np.int64)
    for row, (s, t) in enumerate(zip(srcs, tgts)):
        src[row, : len(s)] = s
        src[row, len(s)] = EOS_ID
        if tagged_targets:
            t_in, t = t, t[1:]
            tgt_in[row, : len(t_in)] = t_in
        else:
            tgt_in[row, 0] = BOS_ID
            tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS_ID
    align = None
    if links is not None:
        grid = np.zeros((B, T, S), dtype=np.float32)
        for row, pairs in enumerate(links):
            if len(pairs):
                grid[row, pairs[:, 1], pairs[:, 0]] = 1.0
        rows = grid.sum(axis=2, keepdims=True)
        align = torch.from_numpy(np.divide(grid, rows, out=np.zeros_like(grid), where=rows > 0))
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), align=align)


def collate(store: Store, indices: Sequence[int], tagged_targets: bool = False, alignments=None) -> Batch:
    """Assemble padded tensors for the examples ``indices`` of ``store`` (see :func:`pad_batch`), with their
    links from ``alignments`` (a :class:`mtkit.data.alignments.AlignmentStore`) when given."""
    links = [alignments.links(int(i)) for i in indices] if alignments is not None else None
    return pad_batch([store.src(int(i)) for i in indices], [store.tgt(int(i)) for i in indices], tagged_targets,
                     links)


def repack(store: Store, pool: list[tuple[np.ndarray, int, int]], resegment: Resegment,
           tagged_targets: bool = False) -> list[Batch]:
    """Re-segment the sentences of a pool of (indices, epoch, position) batches and deal them out again.

    Sampled segmentations vary in length, so padding each batch to its longest would waste a
    third of it (measured on Multi30k at BPE-dropout 0.1). Instead the pool's sentences are
    sorted by their new lengths and dealt back in that order, the shortest to the batch that
    held the shortest stored ones: every batch keeps its size, epoch and position.
    """
    indices = np.concatenate([ix for ix, _, _ in pool])
    srcs, tgts = resegment([store.src(int(i)) for i in indices], [store.tgt(int(i)) for i in indices])
    order = np.argsort([max(len(s), len(t)) for s, t in zip(srcs, tgts)], kind="stable")
    stored = [int(max(store.src_lengths[ix].max(), store.tgt_lengths[ix].max())) for ix, _, _ in pool]
    batches: list[Batch | None] = [None] * len(pool)
    start = 0
    for slot in np.argsort(stored, kind="stable"):
        rows = order[start : start + len(pool[slot][0])]
        start += len(rows)
        batch = pad_batch([srcs[i] for i in rows], [tgts[i] for i in rows], tagged_targets)
        batch.epoch, batch.position = pool[slot][1], pool[slot][2]
        batches[slot] = batch
    return batches  # type: ignore[return-value]


def _batches(store: Store, sampler: TokenBatchSampler, resegment: Resegment | None,
             tagged_targets: bool = False, alignments=None, augment: Augment | None = None) -> Iterator[Batch]:
    """The sampler's batches, assembled; each carries the sampler position after it."""
    pool: list[tuple[np.ndarray, int, int]] = []
    for batch_epoch, indices in sampler:
        # Read right after the yield: the state is the position after this batch.
        epoch, position = sampler.state.epoch, sampler.state.position
        if augment is not None:  # (each pair's changes depend on the epoch it is read in, not on the batch)
            batch = pad_batch(*augment(store, indices, batch_epoch), tagged_targets)
            batch.epoch, batch.position = epoch, position
            yield batch
            continue
        if resegment is None:
            batch = collate(store, indices, tagged_targets, alignments)
            batch.epoch, batch.position = epoch, position
            yield batch
            continue
        if pool and pool[-1][1] != epoch:  # pools stay within an epoch
            yield from repack(store, pool, resegment, tagged_targets)
            pool = []
        pool.append((indices, epoch, position))
        if len(pool) == REPACK_POOL:
            yield from repack(store, pool, resegment, tagged_targets)
            pool = []


def prefetch(store: Store, sampler: TokenBatchSampler, depth: int = 8, resegment: Resegment | None = None,
             tagged_targets: bool = False, alignments=None, augment: Augment | None = None) -> Iterator[Batch]:
    """Assemble batches in a background thread, ``depth`` ahead, so the step never waits for data.

    Each Batch carries the sampler position after it, which is what a checkpoint must
    record (the thread runs ahead of the training step). With ``resegment`` (BPE-dropout,
    mtkit.training.bpe_dropout) the sentences of every REPACK_POOL batches are re-segmented
    and dealt out again by length (:func:`repack`). ``alignments``: the store's links, for guided alignment.
    ``augment``: train.augment's modifiers (mtkit.training.augment), applied to each batch's pairs.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        try:
            for batch in _batches(store, sampler, resegment, tagged_targets, alignments, augment):
                while not stop.is_set():
                    try:
                        q.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as e:  # hand the error to the consumer
            q.put(e)

    thread = threading.Thread(target=work, daemon=True, name="mtkit-batches")
    thread.start()
    try:
        while True:
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        # Wait for the batch in progress: a thread still inside native code (SentencePiece)
        # when the interpreter exits aborts the process.
        thread.join(timeout=60)
