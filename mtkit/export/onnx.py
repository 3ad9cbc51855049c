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

import contextlib
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, config_to_dict
from mtkit.engines import manifest
from mtkit.engines.onnx_engine import ENCODER, STEP, OnnxModel, graph_names
from mtkit.errors import MtkitError
from mtkit.export.protocol import Exporter, export
from mtkit.model import DecoderCache, LayerCache, Transformer

logger = logging.getLogger(__name__)

TOLERANCE = 1e-4
OPSET = 18


class EncoderGraph(nn.Module):
    """``encoder.onnx``: src (B, S) -> every decoder layer's cross keys and values (B, h, S, d_k), in order."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src):
        memory, _ = self.model.encode(src)
        out = []
        for layer in self.model.decoder.layers:
            out += list(layer.cross_attn.project_kv(memory))
        return tuple(out)


class StepGraph(nn.Module):
    """``decoder_step.onnx``: one decoding step, the key/value cache explicit in and out (the module's
    docstring gives the names and shapes)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens, src_mask, *cache):
        n = len(self.model.decoder.layers)
        layers = [LayerCache(*cache[4 * i: 4 * i + 4]) for i in range(n)]
        state = DecoderCache(layers=layers, src_mask=src_mask[:, None, None, :], beam=1, step=cache[0].shape[2])
        hidden, state = self.model.decoder.step(tokens, state)
        out = [self.model.logits(hidden[:, 0])]
        for layer in state.layers:
            out += [layer.self_k, layer.self_v]
        return tuple(out)


def refusals(cfg) -> list[str]:
    out = []
    if cfg.data.pairs and cfg.data.tag_side == "target":
        out.append("data.tag_side is 'target': the ONNX decoder starts from BOS")
    return out


class OnnxExport(Exporter):
    """The export of ``loaded`` (a LoadedModel) as ``encoder.onnx``, ``decoder_step.onnx``, its SentencePiece
    model(s) and ``mtkit.json``, by the exporters' steps (:func:`mtkit.export.protocol.export`); each stage is
    said (tracing takes a while: tens of seconds for a small model)."""

    target = "ONNX"

    def __init__(self, loaded) -> None:
        self.loaded = loaded
        self.model: Transformer | None = None

    def refusals(self) -> list[str]:
        return refusals(self.loaded.config)

    def require(self) -> None:
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401  (torch.onnx's exporter)
        except ImportError:
            raise MtkitError("exporting to ONNX needs onnx and onnxscript (pip install 'mtkit[onnx]')") from None

    def prepare(self) -> None:
        loaded = self.loaded
        # The paper's modules with the reference kernels: the formulas as written, which trace to plain operators.
        model = Transformer(loaded.config.model, loaded.vocab.src_size, loaded.vocab.tgt_size,
                            kernels="reference").eval()
        model.load_state_dict(loaded.model.state_dict())
        self.model = model

    @contextlib.contextmanager
    def building(self):
        onnx_log = logging.getLogger("torch.onnx")  # its notes (a missing torchvision's operators) are not ours
        level = onnx_log.level
        onnx_log.setLevel(logging.ERROR)
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            onnx_log.setLevel(level)

    def write(self, folder: Path) -> None:
        """Trace and save both graphs, then the vocabulary and mtkit.json."""
        loaded, model = self.loaded, self.model
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
            logger.info(f"tracing the {'encoder' if key == 'encoder' else 'decoding step'} graph ({name}) "
                        "with torch.onnx")
            try:
                program = torch.onnx.export(graph, args, dynamic_shapes=shapes, input_names=io[key]["inputs"],
                                            output_names=io[key]["outputs"], opset_version=OPSET, dynamo=True,
                                            verbose=False)
            except Exception as e:  # noqa: BLE001 (the exporter's own errors: one line)
                why = (str(e).strip().splitlines() or [""])[0][:200]
                raise MtkitError(f"torch.onnx could not export the {key} graph ({type(e).__name__}: {why})") from None
            program.save(str(folder / name))
        data = loaded.config.data
        manifest.write(folder, manifest.record(
            loaded, spm=loaded.vocab.save(folder), model=config_to_dict(cfg),
            decode=config_to_dict(loaded.config.decode), src_vocab_size=loaded.vocab.src_size,
            tgt_vocab_size=loaded.vocab.tgt_size,
            graphs={"encoder": {"file": ENCODER, **io["encoder"]}, "step": {"file": STEP, **io["step"]}},
            **({"data": {"src_lang": data.src_lang, "tgt_lang": data.tgt_lang}}
               if data.src_lang and data.tgt_lang else {}),
            **manifest.languages(data)))

    def check(self, folder: Path) -> None:
        """Both graphs, run by ONNX Runtime, give mtkit's logits on a probe batch to :data:`TOLERANCE`."""
        logger.info("checking the graphs in ONNX Runtime against mtkit's logits")
        diff = probe_difference(self.model, folder)
        if not diff <= TOLERANCE:
            raise MtkitError(f"the ONNX graphs' logits differ from mtkit's by {diff:.3g}; nothing written")
        logger.info(f"ONNX graphs checked against mtkit: largest logit difference {diff:.2g}")


def export_model(loaded, out_dir: str | Path) -> Path:
    """Write ``loaded`` (a LoadedModel) as ONNX graphs in ``out_dir`` (:class:`OnnxExport`: built beside it,
    checked, renamed into place)."""
    return export(OnnxExport(loaded), out_dir)


def probe_difference(model, folder: Path) -> float:
    """The largest logit difference of three decoding steps through ONNX Runtime (the encoder, then the step
    graph with its cache in and out) against mtkit's teacher-forced pass."""
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
