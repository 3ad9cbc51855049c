"""The training loop: token batches → label-smoothed loss → Adam with warm-up, with
gradient accumulation, mixed precision, DDP, validation, checkpoints and exact resume.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mtkit import __version__
from mtkit.config import PAD_ID, Config, config_from_dict, config_to_dict, save_config
from mtkit.errors import MtkitError
from mtkit.model import Transformer, count_parameters
from mtkit.training import distributed
from mtkit.training.batching import Batch, SamplerState, TokenBatchSampler, collate, make_batches, prefetch
from mtkit.training.checkpoint import (
    CHECKPOINT_FORMAT,
    link_atomically,
    load_checkpoint,
    save_checkpoint,
    step_checkpoints,
)
from mtkit.training.loss import TranslationLoss, perplexity
from mtkit.training.optim import build_optimizer, learning_rate, set_learning_rate
from mtkit.training.precision import allow_tf32, autocast, check_precision, grad_scaler


@dataclass
class TrainResult:
    step: int
    last_checkpoint: Path | None
    best_checkpoint: Path | None
    averaged_checkpoint: Path | None
    final_loss: float
    minutes: float
    stopped_because: str


def check_prepared(data_dir: Path) -> None:
    if not (Path(data_dir) / "manifest.json").is_file():
        raise MtkitError(f"{data_dir}: not a prepared data directory (no manifest.json); run `mtkit prepare` first")


def select_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MtkitError(f"train.device={name}, but no CUDA device is available")
    return torch.device(name)


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line (training logs and validations)."""

    def __init__(self, path: Path, enabled: bool, tensorboard: bool = False) -> None:
        self.path = path
        self.enabled = enabled
        self.tensorboard = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MtkitError("train.tensorboard needs the tensorboard package: pip install 'mtkit[tensorboard]'") from None
            self.tensorboard = SummaryWriter(log_dir=str(path.parent / "tensorboard"))

    def truncate_after(self, step: int) -> None:
        """On resume, forget what an interrupted run logged after its last checkpoint."""
        if not (self.enabled and self.path.exists()):
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tensorboard.add_scalar(key, value, record.get("step", 0))
            self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


class Trainer:
    """Owns the model, optimizer and data of one training run (one process of it)."""

    def __init__(self, config: Config, data_dir: Path, run_dir: Path, progress: bool | None = None) -> None:
        from mtkit.data.store import ParallelStore
        from mtkit.data.vocab import Vocab

        self.config = config
        self.cfg = config.train
        self.data_dir = Path(data_dir)
        self.run_dir = Path(run_dir)
        device_type = "cuda" if (self.cfg.device.startswith("cuda") or (self.cfg.device == "auto" and torch.cuda.is_available())) else "cpu"
        check_precision(self.cfg.precision, device_type)
        self.dist = distributed.init_distributed(device_type)
        self.device = select_device(self.cfg.device, self.dist.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            allow_tf32()
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.progress = self.progress and self.dist.is_main

        check_prepared(self.data_dir)
        self.vocab = Vocab.load(self.data_dir)
        self.train_store = ParallelStore.open(self.data_dir, "train")
        has_valid = (self.data_dir / "valid.store.json").is_file()
        self.valid_store = ParallelStore.open(self.data_dir, "valid") if has_valid else None
        if self.valid_store is not None and len(self.valid_store) == 0:
            self.valid_store = None

        torch.manual_seed(self.cfg.seed)
        self.model = Transformer(config.model, self.vocab.src_size, self.vocab.tgt_size, pad_id=PAD_ID).to(self.device)
        self.optimizer = build_optimizer(self.model.parameters(), self.cfg, self.device.type)
        self.scaler = grad_scaler(self.cfg.precision, self.device.type)
        self.sampler = TokenBatchSampler(
            self.train_store.src_lengths,
            self.train_store.tgt_lengths,
            self.cfg.max_tokens,
            self.cfg.seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
        )
        self.bpe_dropout = None
        self.length_growth = (1.0, 1.0)
        if self.cfg.bpe_dropout > 0:
            from mtkit.training.bpe_dropout import BPEDropout

            self.bpe_dropout = BPEDropout(self.vocab, self.cfg.bpe_dropout, self.cfg.seed,
                                          max_len=config.model.max_positions - 1)
            # Averaged over ranks so that every rank cuts the same batches; a resumed run reuses the saved one.
            growth = self.bpe_dropout.growth(self.train_store)
            self._set_length_growth(tuple(distributed.all_reduce_sum(g, self.device) / self.dist.world_size for g in growth))
        self.step = 0
        self.elapsed = 0.0  # training seconds, summed over resumed runs
        self.best: float | None = None
        self.bad_validations = 0
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.log = MetricsLog(self.run_dir / "metrics.jsonl", self.dist.is_main, self.cfg.tensorboard)

        self.criterion = TranslationLoss(self.model, self.cfg.label_smoothing, PAD_ID, rdrop_alpha=self.cfg.rdrop_alpha)
        self.train_model = self.criterion  # model + loss: (src, tgt_in, tgt_out) -> (loss_sum, nll_sum, n)
        self.ddp = None  # the DDP wrapper, kept for no_sync() (a compiled module does not expose it)
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.ddp = DDP(self.criterion, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            self.train_model = self.ddp
        if self.cfg.compile:
            self.train_model = torch.compile(self.train_model)

    # ------------------------------------------------------------------ state

    def _set_length_growth(self, growth: tuple[float, float]) -> None:
        """Budget batches for BPE-dropout's longer segmentations (mtkit.training.bpe_dropout)."""
        from mtkit.training.bpe_dropout import scaled_lengths

        self.length_growth = (float(growth[0]), float(growth[1]))
        self.sampler.src_lengths = scaled_lengths(self.train_store.src_lengths, self.length_growth[0])
        self.sampler.tgt_lengths = scaled_lengths(self.train_store.tgt_lengths, self.length_growth[1])

    def state_dict(self, position: SamplerState) -> dict:
        src_bytes, tgt_bytes = self.vocab.model_bytes()
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "format_version": CHECKPOINT_FORMAT,
            "mtkit_version": __version__,
            "config": config_to_dict(self.config),
            "model": self.model.state_dict(),
            "vocab": {"src": src_bytes, "tgt": tgt_bytes},
            "src_vocab_size": self.vocab.src_size,
            "tgt_vocab_size": self.vocab.tgt_size,
            "step": self.step,
            "epoch": position.epoch,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"name": self.cfg.lr_schedule, "step": self.step},
            "scaler": self.scaler.state_dict(),
            "rng": rng,
            "sampler": {"epoch": position.epoch, "position": position.position},
            "elapsed": self.elapsed,
            "best": self.best,
            "bad_validations": self.bad_validations,
            "length_growth": list(self.length_growth),
        }

    def load_state_dict(self, ckpt: dict) -> None:
        saved = config_from_dict(ckpt["config"])
        if saved.model != self.config.model:
            raise MtkitError(f"{self.ckpt_dir}: the checkpoint's model config differs from this recipe's; use a new run directory")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scaler.load_state_dict(ckpt["scaler"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if "cuda" in ckpt["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        if self.bpe_dropout is not None and "length_growth" in ckpt:
            self._set_length_growth(tuple(ckpt["length_growth"]))
        self.sampler.state = SamplerState(ckpt["sampler"]["epoch"], ckpt["sampler"]["position"])
        self.step = ckpt["step"]
        self.elapsed = ckpt.get("elapsed", 0.0)
        self.best = ckpt.get("best")
        self.bad_validations = ckpt.get("bad_validations", 0)

    def save(self, position: SamplerState) -> Path:
        """Write step_N.pt, point last.pt at it, prune old step files (rank 0 only)."""
        path = self.ckpt_dir / f"step_{self.step:07d}.pt"
        save_checkpoint(self.state_dict(position), path)
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
                    loss_sum, nll_sum, _ = self.train_model(batch.src, batch.tgt_in, batch.tgt_out)
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
        return {
            "loss_sum": loss_total,
            "nll_sum": nll_total,
            "tokens": sum(b.n_tgt_tokens for b in batches),
            "lr": lr,
            "grad_norm": grad_norm,
            "skipped": skipped,
            "padding": sum(b.padding_fraction for b in batches) / len(batches),
        }

    @torch.no_grad()
    def validate_loss(self) -> dict:
        """Loss, NLL and perplexity per target token on the validation split (each rank takes every
        world_size-th batch; the sums are all-reduced, so every rank gets the same values)."""
        assert self.valid_store is not None
        self.model.eval()
        loss_sum = nll_sum = 0.0
        n = 0
        batches = make_batches(self.valid_store.src_lengths, self.valid_store.tgt_lengths, self.cfg.max_tokens, 0)
        for indices in batches[self.dist.rank :: self.dist.world_size]:
            batch = collate(self.valid_store, indices).to(self.device)
            with autocast(self.cfg.precision, self.device.type):
                loss, nll, count = self.criterion(batch.src, batch.tgt_in, batch.tgt_out)
            loss_sum += float(loss)
            nll_sum += float(nll)
            n += count
        loss_sum, nll_sum, n = distributed.all_reduce_sums([loss_sum, nll_sum, n], self.device)
        return {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": perplexity(nll_sum / n)}

    def validate_bleu(self) -> float:
        """sacreBLEU of the model's translations of the validation sources against the raw references."""
        from mtkit.training.validation import validation_bleu

        self.model.eval()
        return validation_bleu(self.model, self.vocab, self.data_dir, self.config.decode, self.cfg.bleu_beam, self.device,
                               self.dist.rank, self.dist.world_size)

    def validate(self, final: bool = False) -> dict:
        record = self.validate_loss()
        # Every rank gets the same values (the loss over the whole set, BLEU gathered), so that
        # early-stopping decisions agree.
        if self.cfg.bleu_every and (final or self.step % self.cfg.bleu_every == 0):
            record["valid_bleu"] = self.validate_bleu()
        return record

    def is_better(self, record: dict) -> bool | None:
        """Whether this validation beats the best so far (None when the metric was not computed)."""
        key = "valid_bleu" if self.cfg.best_metric == "bleu" else "valid_loss"
        if key not in record:
            return None
        value = record[key]
        better = self.best is None or (value > self.best if key == "valid_bleu" else value < self.best)
        if better:
            self.best = value
        return better

    def run(self, resume: bool | None = None) -> TrainResult:
        """Train until max_steps / max_epochs / max_minutes / early stopping. ``resume``:
        None = continue from ``last.pt`` when the run directory has one; True = must; False = must not."""
        last = self.ckpt_dir / "last.pt"
        if last.exists() and resume is not False:
            self.load_state_dict(load_checkpoint(last))
            self.log.truncate_after(self.step)
        elif resume:
            raise MtkitError(f"{self.run_dir}: nothing to resume (no checkpoints/last.pt)")
        elif last.exists():
            raise MtkitError(f"{self.run_dir}: already holds a run; resume it or choose a new run directory")
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.config, self.run_dir / "config.yaml")
            self._copy_vocab()
            if self.step == 0:
                self.log.write({"step": 0, "event": "start", "parameters": count_parameters(self.model),
                                "world_size": self.dist.world_size, "device": str(self.device),
                                **({"bpe_dropout_growth": list(self.length_growth)} if self.bpe_dropout else {})})

        cfg = self.cfg
        batches = prefetch(self.train_store, self.sampler, resegment=self.bpe_dropout)
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True, file=sys.stderr)
        window = {"loss_sum": 0.0, "nll_sum": 0.0, "tokens": 0, "padding": 0.0, "updates": 0, "skipped": 0}
        window_start = time.perf_counter()
        session_start = time.perf_counter()
        elapsed_at_start = self.elapsed
        last_save_time = time.perf_counter()
        last_path: Path | None = None
        validated_step = -1
        stopped = "max_steps"
        position = self.sampler.state
        final_loss = float("nan")
        try:
            while self.step < cfg.max_steps:
                group = [next(batches).to(self.device) for _ in range(cfg.update_freq)]
                position = SamplerState(group[-1].epoch, group[-1].position)
                if cfg.max_epochs and group[0].epoch > cfg.max_epochs:
                    stopped = "max_epochs"
                    break
                stats = self.train_step(group)
                self.elapsed = elapsed_at_start + (time.perf_counter() - session_start)
                for key in ("loss_sum", "nll_sum", "tokens", "padding"):
                    window[key] += stats[key]
                window["updates"] += 1
                window["skipped"] += int(stats["skipped"])
                if stats["skipped"]:
                    print(f"warning: step {self.step}: non-finite gradients (norm {stats['grad_norm']}); update skipped",
                          file=sys.stderr)

                if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    final_loss = self._log_window(window, window_start, stats, bar)
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
                # Each rank has its own clock: all stop at the same step, or DDP would wait forever.
                if cfg.max_minutes and distributed.any_rank(self.elapsed >= 60 * cfg.max_minutes, self.device):
                    stopped = "max_minutes"
                    break
        finally:
            batches.close()
            if bar is not None:
                bar.close()

        averaged = None
        if validated_step != self.step and cfg.valid_every and self.valid_store is not None:
            # Validate the final weights too, so that `best` can be the end of training.
            last_path = self._validate_and_save(position, None, final=True)
        elif self.dist.is_main and (last_path is None or last_path.name != f"step_{self.step:07d}.pt"):
            last_path = self.save(position)
        if self.dist.is_main:
            if cfg.average_last > 1:
                from mtkit.training.average import average_checkpoints

                paths = step_checkpoints(self.run_dir)[-cfg.average_last:]
                averaged = average_checkpoints(paths, self.ckpt_dir / "averaged.pt")
            self.log.write({"step": self.step, "event": "end", "stopped": stopped, "minutes": self.elapsed / 60})
            self.log.close()
            self._draw_curves()
        distributed.barrier()
        best = self.ckpt_dir / "best.pt"
        return TrainResult(self.step, last_path, best if best.exists() else None, averaged, final_loss,
                           self.elapsed / 60, stopped)

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
        if bar is not None:
            bar.write(f"step {self.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in record.items()))
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
        return loss

    def _copy_vocab(self) -> None:
        import shutil

        for name in ("spm.model", "spm.src.model", "spm.tgt.model"):
            if (self.data_dir / name).exists() and not (self.run_dir / name).exists():
                shutil.copyfile(self.data_dir / name, self.run_dir / name)

    def _draw_curves(self) -> None:
        try:
            from mtkit.training.curves import draw_curves

            draw_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png")
        except ImportError:  # matplotlib is optional for training
            pass


def train(config: Config, data_dir: Path, run_dir: Path, resume: bool | None = None, progress: bool | None = None) -> TrainResult:
    """Train ``config`` on the prepared ``data_dir`` into ``run_dir`` (resuming when it holds a run)."""
    trainer = Trainer(config, data_dir, run_dir, progress)
    try:
        return trainer.run(resume)
    finally:
        distributed.shutdown()
