"""Export to ONNX: an mtkit model as two graphs, the encoder and one decoding step, traced by ``torch.onnx`` from
mtkit's own modules (no optimum, no transformers).

* ``encoder.onnx``: ``src`` (B, S) int64 ids, padded with PAD and each ending in EOS -> ``cross_k.i`` and
  ``cross_v.i`` (B, h, S, d_k) for every decoder layer i: the encoder output (§3.1) projected once into the
  keys and values each decoder layer attends to (what :meth:`mtkit.model.Transformer.init_cache` computes).
* ``decoder_step.onnx``: ``tokens`` (N, 1) int64 (each row's last token), ``src_mask`` (N, S) bool (True at
  real source tokens), and per layer ``self_k.i`` / ``self_v.i`` (N, h, t, d_k), the keys and values of the t
  tokens so far, and ``cross_k.i`` / ``cross_v.i`` (N, h, S, d_k) -> ``logits`` (N, V) for the next token and
  ``new_self_k.i`` / ``new_self_v.i`` (N, h, t + 1, d_k): the key/value cache is explicit, in and out. The
  position of the new token is t, read from the cache's shape. One row per hypothesis: a sentence's beam rows
  carry its cross keys and values each (:class:`mtkit.engines.onnx_engine.OnnxModel` repeats them once).

The folder also holds the SentencePiece model(s) and ``mtkit.json`` (the config: model, decode, data's languages,
the names of the graphs' inputs and outputs), so that :mod:`mtkit.engines.onnx_engine` needs nothing else.
The export checks itself: both graphs, run by ONNX Runtime, give mtkit's logits on a probe batch to 1e-4.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from mtkit.config import BOS_ID, EOS_ID, PAD_ID
from mtkit.engines.onnx_engine import ENCODER, MANIFEST, STEP, graph_names
from mtkit.errors import MtkitError
from mtkit.io import atomic_directory, refuse_non_empty

stderr = logging.getLogger(__name__).info  # where it says things by default: the mtkit logger

TOLERANCE = 1e-4
OPSET = 18


def _modules():
    """The two graphs' modules, defined on first use (torch is imported only when exporting)."""
    import torch
    from torch import nn

    from mtkit.model import DecoderCache, LayerCache

    class EncoderGraph(nn.Module):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, src):
            memory, _ = self.model.encode(src)
            out = []
            for layer in self.model.decoder.layers:
                out += list(layer.cross_attn.project_kv(memory))
            return tuple(out)

    class StepGraph(nn.Module):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens, src_mask, *cache):
            n = len(self.model.decoder.layers)
            layers = [LayerCache(*cache[4 * i: 4 * i + 4]) for i in range(n)]
            state = DecoderCache(layers=layers, src_mask=src_mask[:, None, None, :], beam=1,
                                 step=cache[0].shape[2])
            hidden, state = self.model.decoder.step(tokens, state)
            out = [self.model.logits(hidden[:, 0])]
            for layer in state.layers:
                out += [layer.self_k, layer.self_v]
            return tuple(out)

    return torch, EncoderGraph, StepGraph


def refusals(cfg) -> list[str]:
    out = []
    if cfg.data.pairs and cfg.data.tag_side == "target":
        out.append("data.tag_side is 'target': the ONNX decoder starts from BOS")
    return out


def export_model(loaded, out_dir: str | Path, log: Callable[[str], None] = stderr) -> Path:
    """Write ``loaded`` (a LoadedModel) as ``encoder.onnx``, ``decoder_step.onnx``, its SentencePiece model(s)
    and ``mtkit.json`` in ``out_dir`` (built beside it and renamed into place); each stage said through ``log``
    (tracing takes a while: tens of seconds for a small model)."""
    out_dir = Path(out_dir)
    problems = refusals(loaded.config)
    if problems:
        raise MtkitError("cannot export to ONNX: " + "; ".join(problems))
    refuse_non_empty(out_dir)
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401  (torch.onnx's exporter)
    except ImportError:
        raise MtkitError("exporting to ONNX needs onnx and onnxscript (pip install 'mtkit[onnx]')") from None
    import torch

    from mtkit.model import Transformer

    cfg = loaded.config.model
    # The paper's modules with the reference kernels: the formulas as written, which trace to plain operators.
    model = Transformer(cfg, loaded.vocab.src_size, loaded.vocab.tgt_size, kernels="reference").eval()
    model.load_state_dict(loaded.model.state_dict())
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    import logging
    import warnings

    onnx_log = logging.getLogger("torch.onnx")  # its notes (a missing torchvision's operators) are not ours
    level = onnx_log.level
    onnx_log.setLevel(logging.ERROR)
    try:
        with atomic_directory(out_dir) as tmp, torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            diff = _write(loaded, model, tmp, log)
    finally:
        onnx_log.setLevel(level)
    log(f"ONNX graphs checked against mtkit: largest logit difference {diff:.2g}")
    return out_dir


def _write(loaded, model, tmp: Path, log: Callable[[str], None]) -> float:
    """Trace and save both graphs, the vocabulary and mtkit.json in ``tmp``; the probe's logit difference."""
    torch, EncoderGraph, StepGraph = _modules()
    from mtkit.config import config_to_dict
    from mtkit.version import __version__

    cfg = loaded.config.model
    layers, h, d_k = cfg.decoder_layers, cfg.h, cfg.d_model // cfg.h
    io = graph_names(layers)
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]]).clamp(max=loaded.vocab.src_size - 1)
    N, S, t = 3, 4, 2
    tokens = torch.full((N, 1), BOS_ID)
    mask = torch.ones(N, S, dtype=torch.bool)
    cache = [torch.zeros(N, h, t if j < 2 else S, d_k) for _ in range(layers) for j in range(4)]
    rows, length, past = torch.export.Dim("rows"), torch.export.Dim("length"), torch.export.Dim("past")
    batch = torch.export.Dim("batch")
    enc_shapes = ({0: batch, 1: length},)
    step_shapes = ({0: rows}, {0: rows, 1: length},  # the cache tensors: one entry, as forward's *cache
                   tuple({0: rows, 2: past if j < 2 else length} for _ in range(layers) for j in range(4)))
    for graph, args, shapes, key, name in ((EncoderGraph(model), (src,), enc_shapes, "encoder", ENCODER),
                                           (StepGraph(model), (tokens, mask, *cache), step_shapes, "step", STEP)):
        log(f"tracing the {'encoder' if key == 'encoder' else 'decoding step'} graph ({name}) with torch.onnx")
        try:
            program = torch.onnx.export(graph, args, dynamic_shapes=shapes, input_names=io[key]["inputs"],
                                        output_names=io[key]["outputs"], opset_version=OPSET, dynamo=True,
                                        verbose=False)
        except Exception as e:  # noqa: BLE001 (the exporter's own errors: one line)
            why = (str(e).strip().splitlines() or [""])[0][:200]
            raise MtkitError(f"torch.onnx could not export the {key} graph ({type(e).__name__}: {why})") from None
        program.save(str(tmp / name))
    spm = loaded.vocab.save(tmp)
    manifest = {"mtkit_version": __version__, "checkpoint": str(loaded.path), "step": loaded.step, "spm": spm,
                "model": config_to_dict(cfg), "decode": config_to_dict(loaded.config.decode),
                "src_vocab_size": loaded.vocab.src_size, "tgt_vocab_size": loaded.vocab.tgt_size,
                "graphs": {"encoder": {"file": ENCODER, **io["encoder"]}, "step": {"file": STEP, **io["step"]}}}
    data = loaded.config.data
    if data.src_lang and data.tgt_lang:
        manifest["data"] = {"src_lang": data.src_lang, "tgt_lang": data.tgt_lang}
    pairs = [[p.src_lang, p.tgt_lang] for p in loaded.config.data.pairs]
    if pairs:
        manifest["pairs"], manifest["tag_side"] = pairs, loaded.config.data.tag_side
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    log("checking the graphs in ONNX Runtime against mtkit's logits")
    diff = probe_difference(model, tmp)
    if not diff <= TOLERANCE:
        raise MtkitError(f"the ONNX graphs' logits differ from mtkit's by {diff:.3g}; nothing written")
    return diff


def probe_difference(model, folder: Path) -> float:
    """The largest logit difference of three decoding steps through ONNX Runtime (the encoder, then the step
    graph with its cache in and out) against mtkit's teacher-forced pass."""
    import torch

    from mtkit.engines.onnx_engine import OnnxModel

    onnx_model = OnnxModel(folder, threads=1)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, model.encoder.embeddings.tokens.num_embeddings, (2, 6), generator=g)
    src[:, -1] = EOS_ID
    src[1, 3:] = PAD_ID
    src[1, 2] = EOS_ID
    tgt = torch.randint(4, model.output_projection.out_features, (2, 3), generator=g)
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        ours = model(src, tgt)
    memory, mask = onnx_model.encode(src)
    cache = onnx_model.init_cache(memory, mask, 1)
    worst = 0.0
    for i in range(tgt.size(1)):
        logits, cache = onnx_model.decode_step(tgt[:, i], cache)
        worst = max(worst, float((logits - ours[:, i]).abs().max()))
    return worst
