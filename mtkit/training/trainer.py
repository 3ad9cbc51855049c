"""The training loop: token batches → label-smoothed loss → Adam with warm-up, with
gradient accumulation, mixed precision, DDP, validation, checkpoints and exact resume.

A training owns its run directory (a lock on ``RUN/.lock``), resumes only on the data and
vocabulary it was trained on, and on SIGINT / SIGTERM saves the step it finished and stops
(:class:`mtkit.training.run_dir.StopSignals`), so that running the same command again continues exactly.

:class:`Trainer` holds one training's state and its loop in one object (the model, optimizer,
scaler, sampler position and run directory that a step, a validation, a save and a resume all
share), which is why this module runs past 450 lines; what is not that state lives beside it: the
checkpoint payload and the resume checks (:mod:`.state`), validation (:mod:`.validation`), the run
directory's signals and metrics log (:mod:`.run_dir`), the checkpoint files (:mod:`.checkpoint`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from mtkit.checkpoints.io import (
    EMA_FILE,
    load_checkpoint,
    model_payload,
    save_checkpoint,
    step_checkpoints,
    vocab_entry,
)
from mtkit.config import PAD_ID, Config, config_to_dict, save_config
from mtkit.data.alignments import AlignmentStore
from mtkit.data.languages import config_pairs, describe, stored_pairs
from mtkit.data.store import ParallelStore
from mtkit.data.vocab import Vocab
from mtkit.engines.device import device_type
from mtkit.engines.precision import allow_tf32, autocast, check_precision, grad_scaler
from mtkit.engines.threads import LoadProbe, ThreadPolicy, usable_cpus, user_threads
from mtkit.errors import Interrupted, MtkitError, counted, shown
from mtkit.metrics.comet import CometScorer
from mtkit.model import Transformer, count_parameters
from mtkit.training import distributed
from mtkit.training.augment import Augmenter
from mtkit.training.average import average_checkpoints
from mtkit.training.batching import Batch, PairMixture, SamplerState, TokenBatchSampler, mixture_probabilities, prefetch
from mtkit.training.bpe_dropout import BPEDropout, scaled_lengths
from mtkit.training.curves import draw_curves
from mtkit.training.ema import ExponentialMovingAverage
from mtkit.training.finetune import Parent, check_vocabulary, resolve_init
from mtkit.training.loss import TranslationLoss, perplexity
from mtkit.training.optim import build_optimizer, learning_rate, set_learning_rate
from mtkit.training.run_dir import (
    MetricsLog,
    RunLock,
    StopSignals,
    check_prepared,
    clock,
    data_fingerprint,
    link_atomically,
    remove_partial_saves,
    select_device,
)
from mtkit.training.state import Counters, Updaters, check_resumable, checkpoint_payload, restore, start_from
from mtkit.training.sync import check_in_sync
from mtkit.training.validation import Scoring, validation_bleus, validation_losses

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    step: int
    last_checkpoint: Path | None
    best_checkpoint: Path | None
    averaged_checkpoint: Path | None
    final_loss: float
    minutes: float
    stopped_because: str


class Trainer:
    """Owns the model, optimizer and data of one training run (one process of it)."""

    def __init__(self, config: Config, data_dir: Path, run_dir: Path, progress: bool | None = None,
                 init: Parent | None = None) -> None:
        """``init``: the checkpoint a new run starts from (:func:`mtkit.training.finetune.resolve_init`,
        which also gives the ``config`` that goes with it); it is checked here, before anything is written."""
        self.config = config
        self.cfg = config.train
        self.data_dir = Path(data_dir)
        self.run_dir = Path(run_dir)
        kind = device_type(self.cfg.device)
        check_precision(self.cfg.precision, kind, use="training")
        self.dist = distributed.init_distributed(kind)
        self.device = select_device(self.cfg.device, self.dist.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            allow_tf32()
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.progress = self.progress and self.dist.is_main
        # On the CPU, one intra-op thread per CPU that other work leaves free, chosen again at each log
        # line (mtkit.engines.threads); a user's OMP_NUM_THREADS, and a torchrun rank's share, stay.
        # Never more than torch's own count (its physical cores, where usable_cpus counts logical ones).
        self.threads = (ThreadPolicy(torch.set_num_threads, user_threads(),
                                     usable=min(usable_cpus(), torch.get_num_threads()))
                        if self.device.type == "cpu" and not self.dist.enabled else None)

        manifest = check_prepared(self.data_dir)
        self.data_fingerprint = data_fingerprint(self.data_dir)
        if self.dist.enabled:
            self._check_same_data()
        self.comet = None  # with comet in train.valid_metrics: loaded now, so that a model not to be had fails first
        if "comet" in self.cfg.valid_metrics and self.cfg.bleu_every:
            self.comet = CometScorer(self.cfg.valid_comet_model, str(self.device))
        self.pairs = self._check_pairs(manifest)  # a multilingual store's pairs; empty for one pair
        self.corpora = manifest.get("corpora") or []  # a single pair's several corpora (data.corpora)
        # data.tag_side "target": the stored targets start with their tag, the decoder's first input
        self.tagged_targets = bool(self.pairs) and config.data.tag_side == "target"
        self.vocab = Vocab.load(self.data_dir)
        if init is not None:
            check_vocabulary(init, self.vocab, self.data_dir)  # before its weights are loaded
        self.train_store = ParallelStore.open(self.data_dir, "train")
        has_valid = (self.data_dir / "valid.store.json").is_file()
        self.valid_store = ParallelStore.open(self.data_dir, "valid") if has_valid else None
        if self.valid_store is not None and len(self.valid_store) == 0:
            self.valid_store = None

        torch.manual_seed(self.cfg.seed)
        self.model = Transformer(config.model, self.vocab.src_size, self.vocab.tgt_size, pad_id=PAD_ID,
                                 kernels=config.kernels).to(self.device)
        self.optimizer = build_optimizer(self.model.parameters(), self.cfg, self.device.type)
        self.init = (init.path, init.step) if init is not None else None
        if init is not None:
            start_from(init, self.model, self.optimizer, self.cfg.init_keep_optimizer)
        self.scaler = grad_scaler(self.cfg.precision, self.device.type)
        self.ema = (ExponentialMovingAverage(self.model, self.cfg.ema_decay, self.cfg.ema_every)
                    if self.cfg.ema_decay > 0 else None)  # from the parent's weights when fine-tuning
        self.mixture_shares: dict[str, float] = {}
        self.sampler = TokenBatchSampler(
            self.train_store.src_lengths,
            self.train_store.tgt_lengths,
            self.cfg.max_tokens,
            self.cfg.seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            mixture=self._mixture(),
        )
        self.bpe_dropout = None
        self.length_growth = (1.0, 1.0)
        if self.cfg.bpe_dropout > 0:
            self.bpe_dropout = BPEDropout(self.vocab, self.cfg.bpe_dropout, self.cfg.seed,
                                          max_len=config.model.max_positions - 1,
                                          tags=self._source_tags(),
                                          tag_side="tgt" if self.tagged_targets else "src")
            # Averaged over ranks so that every rank cuts the same batches; a resumed run reuses the saved one.
            growth = self.bpe_dropout.growth(self.train_store)
            self._set_length_growth(tuple(distributed.all_reduce_sum(g, self.device) / self.dist.world_size
                                          for g in growth))
        self.augment = None
        if self.cfg.augment.on:
            self.augment = Augmenter(self.vocab, self.cfg.augment, self.cfg.seed,
                                     max_len=config.model.max_positions - 1, tags=self._source_tags(),
                                     tag_side="tgt" if self.tagged_targets else "src")
            self.augment.learn_alphabet(self.train_store)
            augment, store = self.augment, self.train_store
            self.sampler.epoch_lengths = lambda epoch: augment.lengths(store, epoch)  # batches cut by them
        self.step = 0
        self.elapsed = 0.0  # training seconds, summed over resumed runs
        self.best: float | None = None
        self.bad_validations = 0
        self.saved_step: int | None = None  # the step of the newest step_N.pt of this run
        self._session = (time.perf_counter(), 0)  # when and at which step this process began training
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.log = MetricsLog(self.run_dir / "metrics.jsonl", self.dist.is_main, self.cfg.tensorboard)

        guided = self.cfg.guided_alignment
        self.alignments = None  # the training pairs' links (mtkit.data.alignments), for guided alignment
        if guided.weight > 0:
            self.alignments = AlignmentStore.open(self.data_dir, "train", self.train_store)
        self.criterion = TranslationLoss(self.model, self.cfg.label_smoothing, PAD_ID, rdrop_alpha=self.cfg.rdrop_alpha,
                                         kernels=config.kernels,
                                         guided=(guided.layer % config.model.decoder_layers, guided.head, guided.weight)
                                         if guided.weight > 0 else None)
        self.train_model = self.criterion  # model + loss: (src, tgt_in, tgt_out) -> (loss_sum, nll_sum, n)
        self.ddp = None  # the DDP wrapper, kept for no_sync() (a compiled module does not expose it)
        if self.dist.enabled:
            self.ddp = DDP(self.criterion, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            self.train_model = self.ddp
        if self.cfg.compile:
            self.train_model = torch.compile(self.train_model)

    def _check_same_data(self) -> None:
        """Every rank trains on the same prepared data: on other machines, each its own copy of it (another
        preparation of the same text would give ids that mean other pieces, with no error anywhere)."""
        prints = distributed.all_gather_objects(self.data_fingerprint)
        odd = [rank for rank, seen in enumerate(prints) if seen != prints[0]]
        if odd:
            theirs, ours = (str(prints[odd[0]])[:12], str(prints[0])[:12])
            raise MtkitError(f"{self.data_dir}: rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} "
                             f"would train on other prepared data than rank 0 (data fingerprint {theirs}… against "
                             f"{ours}…): give every machine a copy of the same prepared DATA"
                             if self.dist.local_rank == 0 else "")

    # ------------------------------------------------------------- languages

    def _check_pairs(self, manifest: dict) -> list:
        """The prepared data's pairs, which must be the recipe's ``data.pairs`` (the checkpoint records
        them: translation reads its targets and tags there), and ``train.best_pair`` among them."""
        stored, wanted = stored_pairs(manifest), config_pairs(self.config.data)
        if [p.pair for p in stored] != wanted:
            has = describe([p.pair for p in stored]) or "one pair, untagged"
            says = describe(wanted) or "one pair (no data.pairs)"
            raise MtkitError(f"data.pairs: {self.data_dir} was prepared for {has}; the recipe says {says}: train "
                             "with the recipe it was prepared with")
        sides = {entry.get("tag_side", "source") for entry in manifest.get("pairs") or []}
        if stored and sides != {self.config.data.tag_side}:
            raise MtkitError(f"data.tag_side: {self.data_dir} was prepared with the tags on the "
                             f"{', '.join(sorted(sides))} side; the recipe says {self.config.data.tag_side}: "
                             "prepare it again with the recipe")
        if self.cfg.best_pair != "mean":
            named = next(p for p in stored if p.pair.name == self.cfg.best_pair)
            if named.segment("valid") is None and self.cfg.valid_every:
                raise MtkitError(f"train.best_pair: {self.cfg.best_pair} has no validation set in {self.data_dir}")
        return stored

    def _mixture(self):
        """The pairs' shares of each epoch (:func:`mtkit.training.batching.mixture_probabilities`); None
        when they are the pairs' own sizes, which is one pass over the store, as for one pair."""
        if self.corpora or self.config.data.corpora:
            return self._corpus_mixture()
        if not self.pairs:
            return None
        segments = [p.segment("train") or (0, 0) for p in self.pairs]
        sizes = [n for _, n in segments]
        weights = [p.weight for p in self.config.data.pairs]
        for pair, weight, n in zip(self.pairs, weights, sizes):
            if weight is not None and n == 0:
                raise MtkitError(f"data.pairs: {pair.pair.name} has a weight but no training data")
        probs = mixture_probabilities(sizes, self.cfg.pair_temperature, weights if weights[0] is not None else None)
        self.mixture_shares = {p.pair.name: float(q) for p, q in zip(self.pairs, probs)}
        proportional = np.asarray(sizes, dtype=np.float64) / max(1, sum(sizes))
        return None if np.allclose(probs, proportional, rtol=0, atol=1e-12) else PairMixture(segments, probs)

    def _source_tags(self) -> list[int]:
        """The tag ids that may lead a stored sentence: the pairs' language tags, the corpora's tags."""
        return [p.tag_id for p in self.pairs] + [e["tag_id"] for e in self.corpora if e.get("tag_id") is not None]

    def _corpus_mixture(self):
        """``data.corpora``'s shares of each epoch: their weights, normalized (the store holds them in order)."""
        wanted = [c.name for c in self.config.data.corpora]
        stored = [e["name"] for e in self.corpora]
        if wanted != stored:
            raise MtkitError(f"data.corpora: {self.data_dir} was prepared with the corpora {', '.join(stored)}; the "
                             f"recipe names {', '.join(wanted) or 'none'}: train with the recipe it was prepared with")
        segments = [(e["splits"]["train"]["start"], e["splits"]["train"]["pairs"]) for e in self.corpora]
        weights = [c.weight for c in self.config.data.corpora]
        for name, (_, n) in zip(stored, segments):
            if n == 0:
                raise MtkitError(f"data.corpora: {name} has no training pairs left in {self.data_dir}")
        probs = mixture_probabilities([n for _, n in segments], 1.0, weights)
        self.mixture_shares = dict(zip(stored, map(float, probs)))
        return PairMixture(segments, probs)

    # ------------------------------------------------------------------ state

    def _set_length_growth(self, growth: tuple[float, float]) -> None:
        """Budget batches for BPE-dropout's longer segmentations (mtkit.training.bpe_dropout)."""
        self.length_growth = (float(growth[0]), float(growth[1]))
        self.sampler.src_lengths = scaled_lengths(self.train_store.src_lengths, self.length_growth[0])
        self.sampler.tgt_lengths = scaled_lengths(self.train_store.tgt_lengths, self.length_growth[1])

    def state_dict(self, position: SamplerState) -> dict:
        counters = Counters(self.step, self.elapsed, self.best, self.bad_validations, self.length_growth)
        return checkpoint_payload(self.config, self.model, Updaters(self.optimizer, self.scaler, self.ema), self.vocab,
                                  self.data_fingerprint, position, counters)

    def load_state_dict(self, ckpt: dict, path: Path | None = None) -> None:
        """Continue from ``ckpt`` (read from ``path``, by default the run's last.pt), checked first."""
        check_resumable(ckpt, path or self.ckpt_dir / "last.pt", run_dir=self.run_dir, data_dir=self.data_dir,
                        config=self.config, model=self.model, vocab=self.vocab,
                        data_fingerprint=self.data_fingerprint)
        self.sampler.state, counters = restore(ckpt, self.model, self.optimizer, self.scaler, self.ema)
        self._restore_counters(ckpt, counters)

    def _restore_counters(self, ckpt: dict, counters: Counters) -> None:
        if self.bpe_dropout is not None and "length_growth" in ckpt:
            self._set_length_growth(counters.length_growth)
        self.step, self.elapsed = counters.step, counters.elapsed
        self.best, self.bad_validations = counters.best, counters.bad_validations

    def save(self, position: SamplerState) -> Path:
        """Write step_N.pt, point last.pt at it, prune old step files (rank 0 only)."""
        path = self.ckpt_dir / f"step_{self.step:07d}.pt"
        save_checkpoint(self.state_dict(position), path)
        self.saved_step = self.step
        link_atomically(path, self.ckpt_dir / "last.pt")
        keep = max(self.cfg.keep_last, self.cfg.average_last, 1)
        for old in step_checkpoints(self.run_dir)[:-keep]:
            old.unlink()
        return path

    # ------------------------------------------------------------- training

    def train_step(self, batches: list[Batch]) -> dict:
        """One update over ``update_freq`` batches; the loss is normalized by the global target-token count."""
        world = self.dist.world_size
        n_tokens = distributed.all_reduce_sum(sum(b.n_tgt_tokens for b in batches), self.device)
        loss_total = nll_total = 0.0
        self.train_model.train()
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if (last or self.ddp is None) else self.ddp.no_sync()
            with sync:
                with autocast(self.cfg.precision, self.device.type):
                    loss_sum, nll_sum, _ = self.train_model(batch.src, batch.tgt_in, batch.tgt_out, batch.align)
                # DDP averages gradients over ranks; scaling by world size makes it a global token mean.
                self.scaler.scale(loss_sum * (world / n_tokens)).backward()
            loss_total += float(loss_sum.detach())
            nll_total += float(nll_sum)

        self.step += 1
        lr = learning_rate(self.step, self.cfg, self.config.model.d_model)
        set_learning_rate(self.optimizer, lr)
        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        skipped = not math.isfinite(grad_norm)
        if self.scaler.is_enabled():
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skips the update itself on inf/NaN gradients
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale_before
        elif not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model, self.step)
        return {
            "loss_sum": loss_total,
            "nll_sum": nll_total,
            "tokens": sum(b.n_tgt_tokens for b in batches),
            "lr": lr,
            "grad_norm": grad_norm,
            "skipped": skipped,
            "padding": sum(b.padding_fraction for b in batches) / len(batches),
        }

    def validate(self, final: bool = False) -> dict:
        """The validation loss, and BLEU every ``train.bleu_every`` steps and at the end. Every rank gets
        the same values (the loss over the whole set, BLEU gathered), so that early-stopping decisions agree."""
        self.model.eval()
        pairs = [p for p in self.pairs if p.segment("valid") is not None]
        record = validation_losses(self.criterion, self.valid_store, pairs, max_tokens=self.cfg.max_tokens,
                                   tagged_targets=self.tagged_targets, precision=self.cfg.precision,
                                   device=self.device, dist=self.dist)
        if self.cfg.bleu_every and (final or self.step % self.cfg.bleu_every == 0):
            # the model's own BLEU: a recipe's shortlist is built from the trained run, after training
            decode = replace(self.config.decode, beam=self.cfg.bleu_beam, shortlist=False)
            record.update(validation_bleus(self.model, self.vocab, self.data_dir, decode, self.device, pairs,
                                           self.config.data.tag_side,
                                           Scoring(self.cfg.valid_metrics, self.comet, self.dist)))
        return record

    def is_better(self, record: dict) -> bool | None:
        """Whether this validation beats the best so far (None when the metric was not computed); a
        multilingual run goes by ``train.best_pair``'s value, or the mean over its pairs."""
        key = "valid_bleu" if self.cfg.best_metric == "bleu" else "valid_loss"
        if self.pairs and self.cfg.best_pair != "mean":
            key = f"{key}/{self.cfg.best_pair}"
        if key not in record:
            return None
        value = record[key]
        better = self.best is None or (value > self.best if key == "valid_bleu" else value < self.best)
        if better:
            self.best = value
        return better

    def run(self, resume: bool | None = None) -> TrainResult:
        """Train until max_steps / max_epochs / max_minutes / early stopping / a signal. ``resume``:
        None = continue from ``last.pt`` when the run directory has one; True = must; False = must not.

        Raises:
            Interrupted: SIGINT or SIGTERM stopped the training after saving its last step.
        """
        lock = RunLock(self.run_dir) if self.dist.is_main else None
        self._own_run_dir(lock, resume)
        try:
            with StopSignals() as signals:
                self._start(resume)
                return self._train(signals)
        except RuntimeError as e:
            if not (self.dist.enabled and distributed.lost_peer(e)):
                raise
            said = shown(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            raise MtkitError(f"rank {self.dist.rank} lost the other ranks at step {self.step} (did a process or a "
                             f"machine stop?): {said}; run the same commands on every machine to resume from rank 0's "
                             "last checkpoint" if self.dist.local_rank == 0 else "") from None
        finally:
            if lock is not None:
                lock.release()

    def _own_run_dir(self, lock: RunLock | None, resume: bool | None) -> None:
        """Rank 0 takes the run directory's lock; every rank learns whether it did, so that all stop.
        The other ranks' run directories are not read: on other machines they may be empty."""
        failure = None
        if lock is not None:
            try:
                if resume and not (self.ckpt_dir / "last.pt").exists():  # before the lock creates the directory
                    raise MtkitError(f"{self.run_dir}: nothing to resume (no checkpoints/last.pt)")
                lock.acquire()
            except MtkitError as e:
                failure = e
        said = distributed.from_main(str(failure) if failure is not None else None)
        if said is not None:
            raise failure or self._told_by_main(said)

    def _told_by_main(self, message: str) -> MtkitError:
        """Rank 0's error on another rank: said again by the first rank of each other machine, so that every
        machine's terminal has it; the rest exit quietly (rank 0 and its machine's first rank said it)."""
        return MtkitError(message if self.dist.local_rank == 0 else "")

    def _start(self, resume: bool | None) -> None:
        """Resume from last.pt, or start afresh; with the lock held, so nobody else writes here."""
        if self.dist.is_main:
            removed = remove_partial_saves(self.run_dir)
            if removed:
                logger.info(f"note: {self.run_dir}: removed {len(removed)} partial file(s) of an interrupted save")
        ckpt = self._resume_point(resume)
        if ckpt is not None:
            self.sampler.state, counters = restore(ckpt, self.model, self.optimizer, self.scaler, self.ema)
            self._restore_counters(ckpt, counters)
            del ckpt
            self.saved_step = self.step
            self.log.truncate_after(self.step)
            if self.dist.is_main:
                last = self.ckpt_dir / "last.pt"
                named = self.ckpt_dir / f"step_{self.step:07d}.pt"
                logger.info(f"resuming {self.run_dir} from step {self.step} "
                            f"(checkpoint {named if named.exists() else last})")
        else:
            self.log.reset()
            if self.init is not None and self.dist.is_main:
                at = f" (step {self.init[1]})" if self.init[1] is not None else ""
                keep = "its Adam moments and " if self.cfg.init_keep_optimizer else ""
                logger.info(f"starting {self.run_dir} from the weights of {self.init[0]}{at}: {keep}a fresh "
                            f"{'' if keep else 'optimizer, '}schedule and step counter")
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.config, self.run_dir / "config.yaml")
            self.vocab.save(self.run_dir)  # the checkpoint's own vocabulary (checked on resume)
            if self.step == 0:
                self.log.write({"step": 0, "event": "start", "parameters": count_parameters(self.model),
                                "world_size": self.dist.world_size, "device": str(self.device),
                                **({"init_from": str(self.init[0]), "init_step": self.init[1]} if self.init else {}),
                                **({"pair_shares": self.mixture_shares} if self.mixture_shares else {}),
                                **({"bpe_dropout_growth": list(self.length_growth)} if self.bpe_dropout else {})})

    def _resume_point(self, resume: bool | None) -> dict | None:
        """The checked checkpoint to continue from (None: a new run), read by rank 0 from its run directory
        and handed to every rank, so that the other machines need neither a shared file system nor a copy:
        all ranks continue from the same weights, optimizer state, RNG and batch position."""
        ckpt, failure = None, None
        if self.dist.is_main:
            last = self.ckpt_dir / "last.pt"
            try:
                if last.exists() and resume is not False:
                    ckpt = load_checkpoint(last)
                    check_resumable(ckpt, last, run_dir=self.run_dir, data_dir=self.data_dir, config=self.config,
                                    model=self.model, vocab=self.vocab, data_fingerprint=self.data_fingerprint)
                elif resume:
                    raise MtkitError(f"{self.run_dir}: nothing to resume (no checkpoints/last.pt)")
                elif last.exists():
                    raise MtkitError(f"{self.run_dir}: already holds a run; resume it or choose a new run directory")
            except MtkitError as e:
                failure = e
        if self.dist.enabled:
            said = distributed.from_main(str(failure) if failure is not None else None)
            if said is not None:
                raise failure or self._told_by_main(said)
            ckpt = distributed.from_main(ckpt)
        elif failure is not None:
            raise failure
        return ckpt

    def _train(self, signals: StopSignals) -> TrainResult:
        cfg = self.cfg
        batches = prefetch(self.train_store, self.sampler, resegment=self.bpe_dropout,
                           tagged_targets=self.tagged_targets, alignments=self.alignments, augment=self.augment)
        bar = None
        if self.progress:
            bar = tqdm(total=cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True, file=sys.stderr)
        window = {"loss_sum": 0.0, "nll_sum": 0.0, "tokens": 0, "padding": 0.0, "updates": 0, "skipped": 0}
        window_start = time.perf_counter()
        session_start = time.perf_counter()
        self._session = (session_start, self.step)
        elapsed_at_start = self.elapsed
        last_save_time = time.perf_counter()
        last_path: Path | None = None
        validated_step = -1
        stopped = "max_steps"
        position = self.sampler.state
        final_loss = float("nan")
        self._check_threads(bar)
        load = LoadProbe()  # what other work kept busy over this session (said when max_minutes stops it)
        try:
            while self.step < cfg.max_steps:
                group = [next(batches).to(self.device) for _ in range(cfg.update_freq)]
                position = SamplerState(group[-1].epoch, group[-1].position)
                if cfg.max_epochs and group[0].epoch > cfg.max_epochs:
                    stopped = "max_epochs"
                    break
                stats = self.train_step(group)
                if self.dist.enabled and cfg.sync_check and self.step % cfg.sync_check == 0:
                    # before this step is logged or saved
                    check_in_sync(self.model, self.step, self.saved_step, speak=self.dist.local_rank == 0)
                self.elapsed = elapsed_at_start + (time.perf_counter() - session_start)
                for key in ("loss_sum", "nll_sum", "tokens", "padding"):
                    window[key] += stats[key]
                window["updates"] += 1
                window["skipped"] += int(stats["skipped"])
                if stats["skipped"]:
                    logger.warning(f"warning: step {self.step}: non-finite gradients (norm {stats['grad_norm']}); "
                                   "update skipped")

                if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    final_loss = self._log_window(window, window_start, stats, bar)
                    self._check_threads(bar)
                    window = {k: 0 if isinstance(v, int) else 0.0 for k, v in window.items()}
                    window_start = time.perf_counter()
                if bar is not None:
                    bar.update(1)

                stop_early = False
                if cfg.valid_every and self.step % cfg.valid_every == 0 and self.valid_store is not None:
                    last_path = self._validate_and_save(position, bar, final=False)
                    last_save_time, validated_step = time.perf_counter(), self.step
                    stop_early = bool(cfg.patience) and self.bad_validations >= cfg.patience
                elif self.dist.is_main and (
                    (cfg.save_every and self.step % cfg.save_every == 0)
                    or (cfg.save_every_minutes and time.perf_counter() - last_save_time >= 60 * cfg.save_every_minutes)
                ):
                    last_path = self.save(position)
                    last_save_time = time.perf_counter()
                if stop_early:
                    stopped = "early_stopping"
                    break
                # Each rank has its own clock and signals: all stop at the same step, or DDP would wait
                # forever. A signal is acted on here, at the end of a whole step (its validation and save
                # included), so that the resumed run continues exactly as this one would have.
                time_up, signalled = distributed.any_ranks(
                    [bool(cfg.max_minutes) and self.elapsed >= 60 * cfg.max_minutes, signals.signum is not None],
                    self.device)
                if time_up:
                    stopped = "max_minutes"
                    break
                if signalled:
                    stopped = "signal"
                    break
        finally:
            batches.close()
            if bar is not None:
                bar.close()
        if stopped == "signal":
            self._stop_on_signal(signals.signum, position)
        others = load.others()
        if stopped == "max_minutes" and self.dist.is_main:
            busy = f"; other work kept {others:.1f} CPUs busy on average" if others is not None else ""
            logger.info(f"train.max_minutes ({cfg.max_minutes:g}) reached at step {self.step} of {cfg.max_steps} "
                        f"({counted(self.step - self._session[1], 'step')} this session{busy})")

        averaged = None
        if validated_step != self.step and cfg.valid_every and self.valid_store is not None:
            # Validate the final weights too, so that `best` can be the end of training.
            last_path = self._validate_and_save(position, None, final=True)
        elif self.dist.is_main and (last_path is None or last_path.name != f"step_{self.step:07d}.pt"):
            last_path = self.save(position)
        # The moving average validated on every rank (validation is collective), saved by rank 0 below.
        ema_record = self._validate_ema() if self.ema is not None else None
        if self.dist.is_main:
            if cfg.average_last > 1:
                paths = step_checkpoints(self.run_dir)[-cfg.average_last:]
                averaged = average_checkpoints(paths, self.ckpt_dir / "averaged.pt")
            if self.ema is not None:
                self._save_ema(ema_record)
            self.log.write({"step": self.step, "event": "end", "stopped": stopped, "minutes": self.elapsed / 60,
                            "busy_cpus": None if others is None else round(others, 2)})
            self.log.close()
            self._draw_curves()
        distributed.barrier()
        best = self.ckpt_dir / "best.pt"
        return TrainResult(self.step, last_path, best if best.exists() else None, averaged, final_loss,
                           self.elapsed / 60, stopped)

    def _validate_ema(self) -> dict | None:
        """Validate the moving average's weights (every rank; None without validation), the trained ones
        restored after."""
        if not (self.cfg.valid_every and self.valid_store is not None):
            return None
        trained = {name: t.detach().clone() for name, t in self.model.state_dict().items()}
        self.model.load_state_dict(self.ema.weights(self.model))
        try:
            return self.validate(final=True)
        finally:
            self.model.load_state_dict(trained)

    def _save_ema(self, record: dict | None) -> Path:
        """``checkpoints/ema.pt``: the moving average as a model checkpoint (rank 0), and its validation
        (``event: ema`` in metrics.jsonl)."""
        path = save_checkpoint(model_payload(config_to_dict(self.config), self.ema.weights(self.model),
                                             vocab_entry(self.vocab), self.vocab.src_size, self.vocab.tgt_size,
                                             step=self.step, ema_decay=self.cfg.ema_decay), self.ckpt_dir / EMA_FILE)
        if record is not None:
            self.log.write({"step": self.step, "event": "ema", **record})
            logger.info(f"step {self.step}: ema weights: " + ", ".join(f"{k} {v:.3f}" for k, v in record.items()))
        return path

    def _stop_on_signal(self, signum: int | None, position: SamplerState) -> None:
        """Save the finished step (rank 0, unless saved already) and raise Interrupted on every rank;
        ``signum`` None: the signal went to another rank (on another machine, say), and counts as SIGTERM."""
        name = signal.Signals(signum).name if signum is not None else "a signal to another rank"
        signum = signum or signal.SIGTERM
        path = self.ckpt_dir / f"step_{self.step:07d}.pt"
        if self.dist.is_main:
            if self.step > 0 and self.saved_step != self.step:
                path = self.save(position)
            self.log.close()
        distributed.barrier()  # the other ranks wait: torchrun would kill rank 0 mid-save when they exit
        if not self.dist.is_main:
            raise Interrupted("", signum)  # rank 0 says it, once
        if self.step == 0:
            raise Interrupted(f"interrupted by {name} before the first update; nothing to save", signum)
        raise Interrupted(f"interrupted by {name} at step {self.step}; saved {path}; "
                          "run the same command to resume", signum)

    # ---------------------------------------------------------------- helpers

    def _validate_and_save(self, position: SamplerState, bar, final: bool) -> Path | None:
        """Validate, log, save a checkpoint (rank 0) and point ``best`` at it when it is the best so far."""
        record = self.validate(final=final)
        better = self.is_better(record)
        if better is False:
            self.bad_validations += 1
        elif better:
            self.bad_validations = 0
        self.log.write({"step": self.step, "epoch": position.epoch, **record})
        line = f"step {self.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in record.items())
        if bar is not None:
            bar.write(line)
        elif self.dist.is_main:
            logger.info(line)
        if not self.dist.is_main:
            return None
        path = self.save(position)
        if better:
            link_atomically(path, self.ckpt_dir / "best.pt")
        self._draw_curves()
        return path

    def _log_window(self, window: dict, start: float, stats: dict, bar) -> float:
        loss_sum, nll_sum, tokens = distributed.all_reduce_sums(
            [window["loss_sum"], window["nll_sum"], window["tokens"]], self.device)
        seconds = max(time.perf_counter() - start, 1e-9)
        loss = loss_sum / max(tokens, 1)
        record = {
            "step": self.step,
            "loss": loss,
            "nll": nll_sum / max(tokens, 1),
            "ppl": perplexity(nll_sum / max(tokens, 1)),
            "lr": stats["lr"],
            "grad_norm": stats["grad_norm"],
            "tgt_tokens_per_s": tokens / seconds,
            "padding": window["padding"] / max(window["updates"], 1),
            "skipped": window["skipped"],
            "minutes": self.elapsed / 60,
        }
        self.log.write(record)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{stats['lr']:.2e}", tok_s=f"{tokens / seconds:.0f}")
        elif self.dist.is_main:  # no terminal (a log file, a scheduler): one line per log_every steps
            logger.info(f"step {self.step}/{self.cfg.max_steps} | loss {loss:.3f} | lr {stats['lr']:.2e} | "
                        f"{tokens / seconds:.0f} tok/s | elapsed {clock(self.elapsed)} | ETA {self._eta()}")
        return loss

    def _check_threads(self, bar) -> None:
        """Fit the intra-op threads to the CPUs free now; say so when the count changes."""
        said = self.threads.check() if self.threads is not None else None
        if said is not None:
            if bar is not None:
                bar.write(said, file=sys.stderr)
            else:
                logger.info(said)

    def _eta(self) -> str:
        """Time to max_steps at this session's pace, or to max_minutes if that comes first."""
        started, first_step = self._session
        left = []
        if self.step > first_step:
            left.append((self.cfg.max_steps - self.step) * (time.perf_counter() - started) / (self.step - first_step))
        if self.cfg.max_minutes:
            left.append(60 * self.cfg.max_minutes - self.elapsed)
        return clock(min(left)) if left else "?"

    def _draw_curves(self) -> None:
        try:
            draw_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png")
        except ImportError:  # matplotlib is optional for training
            pass


def train(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None,
          progress: bool | None = None) -> TrainResult:
    """Train ``config`` on the prepared ``data_dir`` into ``run_dir`` (resuming when it holds a run;
    a new run with ``train.init_from`` starts from that checkpoint's weights)."""
    config, parent = resolve_init(config, Path(run_dir), resume)
    trainer = Trainer(config, data_dir, run_dir, progress, init=parent)
    del parent  # the parent's tensors are copied into the model: free them
    try:
        return trainer.run(resume)
    finally:
        distributed.shutdown()
