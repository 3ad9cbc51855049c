"""Checkpoint averaging (§6.1: the last 5 checkpoints for base models, the last 20 for big)."""

from __future__ import annotations

from pathlib import Path

from mtkit.checkpoints.io import load_checkpoint, model_payload, save_checkpoint, step_checkpoints
from mtkit.errors import MtkitError, counted


def average_checkpoints(paths: list[Path], output: Path) -> Path:
    """Write a checkpoint whose model tensors are the element-wise mean of ``paths``'.

    Accumulates in float64, one checkpoint in memory at a time, and keeps the first
    checkpoint's config and vocabulary. Checkpoints of different vocabularies (SentencePiece
    models, even of one size) or parameter shapes are refused: their ids mean different pieces. The
    result holds no optimizer state: it is for translation and evaluation, not for resuming.
    """
    if not paths:
        raise MtkitError("no checkpoints to average")
    total: dict = {}
    first: dict | None = None
    step = 0
    for path in paths:
        ckpt = load_checkpoint(path)
        state = ckpt["model"]
        step = ckpt.get("step", step)
        if first is None:
            first = ckpt
            total = {k: v.double().clone() if v.is_floating_point() else v for k, v in state.items()}
            continue
        if ckpt.get("vocab") != first.get("vocab"):  # as an ensemble (mtkit.checkpoints.io.check_one_vocabulary)
            raise MtkitError(f"{path}: its vocabulary (SentencePiece model) differs from {paths[0]}'s; averaging "
                             "needs checkpoints of one vocabulary (of one run)")
        if state.keys() != total.keys():
            raise MtkitError(f"{path}: its parameters differ from {paths[0]}'s; cannot average")
        for k, v in state.items():
            if v.shape != total[k].shape:
                raise MtkitError(f"{path}: its {k} has shape {tuple(v.shape)}, {paths[0]}'s "
                                 f"{tuple(total[k].shape)}; cannot average")
            if v.is_floating_point():
                total[k] += v.double()
    assert first is not None
    dtype_of = {k: v.dtype for k, v in first["model"].items()}
    model = {k: (v / len(paths)).to(dtype_of[k]) if v.is_floating_point() else v for k, v in total.items()}
    # step: the newest averaged's, which resolve_checkpoint compares with the run's newest
    payload = model_payload(first["config"], model, first["vocab"], first["src_vocab_size"], first["tgt_vocab_size"],
                            data_fingerprint=first.get("data_fingerprint"), averaged_from=[str(p) for p in paths],
                            step=step)
    return save_checkpoint(payload, output)


def average_run(run_dir: Path, last: int, output: Path | None = None) -> Path:
    """Average the last ``last`` step checkpoints of a run into ``checkpoints/averaged.pt`` (or ``output``)."""
    if last < 1:  # paths[-0:] would be every checkpoint, and paths[1:] all but the first
        raise MtkitError(f"--last must be at least 1, got {last}")
    paths = step_checkpoints(run_dir)
    if not paths:
        raise MtkitError(f"{run_dir}: no step checkpoints to average (expected checkpoints/step_*.pt)")
    if last > len(paths):
        raise MtkitError(f"{run_dir}: asked to average the last {counted(last, 'checkpoint')}, but only {len(paths)} "
                         f"{'exists' if len(paths) == 1 else 'exist'}")
    return average_checkpoints(paths[-last:], output or Path(run_dir) / "checkpoints" / "averaged.pt")
