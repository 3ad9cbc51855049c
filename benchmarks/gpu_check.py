"""GPU check: training speed of transformer-base and -big in bf16 and fp16 on batches of the
paper's size, peak GPU memory, projected time for the paper's 100k / 300k steps, and beam-4
translation speed. Prints a table; meant to finish in well under 8 minutes on one modern GPU.

    python benchmarks/gpu_check.py [--steps 20] [--tokens 25000]
"""

from __future__ import annotations

import argparse
import time

import torch

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, config_from_dict
from mtkit.engines.precision import autocast, grad_scaler
from mtkit.model import Transformer, count_parameters
from mtkit.training.loss import TranslationLoss

PAPER_STEPS = {"transformer-base": 100_000, "transformer-big": 300_000}


def synthetic_batch(tokens: int, vocab: int, device, seed: int = 0):
    """~`tokens` source and target tokens in sentences of 20-40 tokens (WMT-like), length-bucketed."""
    g = torch.Generator().manual_seed(seed)
    length = 30
    n = tokens // length
    src = torch.randint(4, vocab, (n, length), generator=g)
    tgt = torch.randint(4, vocab, (n, length), generator=g)
    src[:, -1] = EOS_ID
    tgt_in = torch.cat([torch.full((n, 1), BOS_ID), tgt[:, :-1]], dim=1)
    return src.to(device), tgt_in.to(device), tgt.to(device)


def train_speed(preset: str, precision: str, steps: int, tokens: int, vocab: int, device: torch.device) -> dict:
    cfg = config_from_dict({"model": {"preset": preset}}).model
    torch.manual_seed(0)
    model = Transformer(cfg, vocab, vocab).to(device)
    criterion = TranslationLoss(model, 0.1, PAD_ID)  # what `mtkit train` runs: model + fused projection and loss
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    scaler = grad_scaler(precision, device.type)
    src, tgt_in, tgt_out = synthetic_batch(tokens, vocab, device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(steps + 3):
        if i == 3:
            sync()
            start = time.perf_counter()
        with autocast(precision, device.type):
            loss, _, n = criterion(src, tgt_in, tgt_out)
        scaler.scale(loss / n).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    sync()
    seconds = (time.perf_counter() - start) / steps
    n_tgt = int((tgt_out != PAD_ID).sum())
    return {
        "preset": preset, "precision": precision, "params_M": count_parameters(model) / 1e6,
        "tgt_tok_s": n_tgt / seconds, "step_s": seconds,
        "peak_GiB": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        "projected_h": seconds * PAPER_STEPS[preset] / 3600,
    }


def beam_speed(precision: str, device: torch.device, sentences: int = 1000, vocab: int = 37000) -> dict:
    from mtkit.decoding.options import SearchOptions
    from mtkit.decoding.search import beam_search
    from mtkit.engines.inference import InferenceModel

    cfg = config_from_dict({"model": {"preset": "transformer-base"}}).model
    model = InferenceModel(Transformer(cfg, vocab, vocab).to(device).eval())  # as the engine decodes: packed, fused
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (sentences, 25), generator=g)
    src[:, -1] = EOS_ID
    src = src.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    produced = 0
    with torch.inference_mode(), autocast(precision, device.type):
        for i in range(0, sentences, 128):
            options = SearchOptions(beam=4, alpha=0.6, max_len_a=0.0, max_len_b=30, min_len=30)
            hyps = beam_search(model, src[i : i + 128], options, kernels=model.kernels)
            produced += sum(len(h[0].tokens) for h in hyps)
    sync()
    seconds = time.perf_counter() - start
    return {"precision": precision, "sent_s": sentences / seconds, "tgt_tok_s": produced / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=25000, help="target tokens per batch (paper: ~25k)")
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--sentences", type=int, default=1000, help="sentences for the beam-4 measurement")
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu for a smoke test of the script")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}")
    precisions = ("bf16", "fp16") if device.type == "cuda" else ("bf16",)
    print(f"{'preset':<18}{'prec':<6}{'params(M)':>10}{'tgt tok/s':>12}{'step (s)':>10}{'peak GiB':>10}"
          f"{'paper steps (h)':>17}")
    for preset in ("transformer-base", "transformer-big"):
        for precision in precisions:
            r = train_speed(preset, precision, args.steps, args.tokens, args.vocab, device)
            print(f"{r['preset']:<18}{r['precision']:<6}{r['params_M']:>10.1f}{r['tgt_tok_s']:>12,.0f}"
                  f"{r['step_s']:>10.3f}{r['peak_GiB']:>10.1f}{r['projected_h']:>17.1f}", flush=True)
    for precision in ("fp32", "bf16"):
        r = beam_speed(precision, device, args.sentences, args.vocab)
        print(f"beam 4, transformer-base, {precision}: {r['sent_s']:,.0f} sentences/s, "
              f"{r['tgt_tok_s']:,.0f} target tokens/s", flush=True)


if __name__ == "__main__":
    main()
