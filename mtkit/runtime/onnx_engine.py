"""ONNX Runtime behind mtkit's search: the two graphs of :mod:`mtkit.export.onnx` as a search model.

:class:`OnnxModel` follows the protocol of :mod:`mtkit.decoding.options` (``encode``, ``init_cache``,
``decode_step``, and the cache's ``reorder`` and ``select_sentences``), so greedy search, sampling and beam
search are mtkit's own loops (:mod:`mtkit.decoding.search`): only the network runs in ONNX Runtime. Tensors
cross as numpy arrays without copies (``torch.from_numpy``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from mtkit.config import PAD_ID
from mtkit.errors import MtkitError

MANIFEST = "mtkit.json"


@dataclass
class OnnxCache:
    """The step graph's explicit state: per layer self_k, self_v (N, h, t, d_k) and cross_k, cross_v
    (N, h, S, d_k), all one row per hypothesis; ``src_mask`` (N, S)."""

    tensors: list[Tensor]  # self_k.0, self_v.0, cross_k.0, cross_v.0, self_k.1, ...
    src_mask: Tensor
    beam: int

    def reorder(self, indices: Tensor) -> OnnxCache:
        # Only the self-attention keys and values move; a sentence's rows share its cross keys and values.
        return replace(self, tensors=[t.index_select(0, indices) if i % 4 < 2 else t
                                      for i, t in enumerate(self.tensors)])

    def select_sentences(self, sentences: Tensor) -> OnnxCache:
        rows = (sentences.unsqueeze(1) * self.beam + torch.arange(self.beam)).flatten()
        return replace(self, tensors=[t.index_select(0, rows) for t in self.tensors],
                       src_mask=self.src_mask.index_select(0, rows))


class OnnxModel:
    """An exported folder's graphs in ONNX Runtime sessions of ``threads`` threads each."""

    def __init__(self, folder: str | Path, threads: int = 1) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise MtkitError("the ONNX engine needs onnxruntime (pip install 'mtkit[onnx]')") from None
        folder = Path(folder)
        try:
            self.manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
            graphs = self.manifest["graphs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MtkitError(f"{folder}: not an mtkit ONNX export ({type(e).__name__}: {e})") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(folder / graphs["encoder"]["file"]), options, providers=providers)
        self.step = ort.InferenceSession(str(folder / graphs["step"]["file"]), options, providers=providers)
        self.step_inputs = graphs["step"]["inputs"]
        self.layers = len(graphs["encoder"]["outputs"]) // 2
        model = self.manifest["model"]
        self.heads, self.d_k = model["h"], model["d_model"] // model["h"]

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        """src (B, S) -> the cross keys and values of every layer (B, h, S, d_k) and the mask (B, S)."""
        out = self.encoder.run(None, {"src": src.numpy()})
        return [torch.from_numpy(a) for a in out], src != PAD_ID

    def init_cache(self, memory: list[Tensor], src_mask: Tensor, beam: int = 1) -> OnnxCache:
        B = src_mask.size(0)
        empty = torch.zeros(B * beam, self.heads, 0, self.d_k)
        tensors = []
        for i in range(self.layers):
            k, v = memory[2 * i], memory[2 * i + 1]
            if beam > 1:
                k, v = k.repeat_interleave(beam, 0), v.repeat_interleave(beam, 0)
            tensors += [empty, empty, k, v]
        mask = src_mask.repeat_interleave(beam, 0) if beam > 1 else src_mask
        return OnnxCache(tensors, mask, beam)

    def decode_step(self, tokens: Tensor, cache: OnnxCache) -> tuple[Tensor, OnnxCache]:
        feed = {"tokens": tokens.reshape(-1, 1).numpy(), "src_mask": cache.src_mask.numpy()}
        for name, t in zip(self.step_inputs[2:], cache.tensors):
            feed[name] = t.contiguous().numpy()
        logits, *new = self.step.run(None, feed)
        tensors = list(cache.tensors)
        for i in range(self.layers):
            tensors[4 * i], tensors[4 * i + 1] = torch.from_numpy(new[2 * i]), torch.from_numpy(new[2 * i + 1])
        return torch.from_numpy(logits), replace(cache, tensors=tensors)
