"""The worker side of ``benchmarks/translate.py``: one engine, in a process of its own.

The parent starts ``python benchmarks/translate.py --worker ENGINE --workdir DIR --threads T``
under the OpenMP wait policy it measures; the worker reads ``DIR/plan.json`` (written by the
parent: the model files, the batches of source ids, the runs), loads its engine and nothing
else, and prints one JSON line: per run, seconds, sentences, output tokens and the outputs.

Engines (ids in, ids out, timed after one warm-up sentence):
  ``mtkit``     mtkit's torch search (:class:`mtkit.engines.torch_engine.TorchEngine`) on the
                saved checkpoint (the opus shape: the run ``mtkit import marian`` wrote), loaded
                as ``mtkit translate`` loads it;
  ``hf``        ``MarianMTModel.generate`` on the ``save_pretrained`` copy (the opus shape: on the
                OPUS-MT folder the mtkit checkpoint was imported from, in Marian's ids, which
                ``plan['marian']`` maps to and from mtkit's);
  ``ct2-fp32``, ``ct2-int8``  CTranslate2 ``translate_batch`` on the exported models;
  ``onnx``      mtkit's search (the same loops) over ONNX Runtime running ``mtkit export onnx``'s graphs
                (:class:`mtkit.engines.onnx_engine.OnnxModel`).
Text in, text out (SentencePiece encode to decode, all sentences, the second of two rounds):
  ``text-mtkit``  ``mtkit translate --engine ctranslate2``'s pipeline (``Ctranslate2Engine``);
  ``text-direct`` CTranslate2 called directly, with the exported SentencePiece model.

The CTranslate2 workers never import torch (CTranslate2 bound to torch's OpenMP runtime runs
several times slower) and the torch workers never import ctranslate2; the JSON line says which
of the two a worker had loaded, so the parent can tell.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from mtkit.config import EOS_ID, PAD_ID, DecodeConfig
from mtkit.host_memory import keep_freed_memory

ENGINES = ("mtkit", "hf", "ct2-fp32", "ct2-int8", "onnx")
POSITIONS = "mtkit_positions.pt"  # beside the HF model: mtkit's sinusoid tables, which save_pretrained leaves out
TEXT_SIDES = ("text-mtkit", "text-direct")


class MtkitEngine:
    def __init__(self, loaded, beam: int, n: int) -> None:
        from mtkit.engines.torch_engine import TorchEngine

        # The checkpoint's forced_eos: "logprob" for mtkit's own, "zero" (generate's) for an imported Marian model.
        decode = DecodeConfig(beam=beam, nbest=1, max_len_a=0.0, max_len_b=n, min_len=n, alpha=0.6,
                              forced_eos=loaded.config.decode.forced_eos)
        self.translator = TorchEngine(loaded, decode)
        self.call = self.translator.call()

    def __call__(self, batch: list[list[int]]) -> list[list[int]]:
        return [hyps[0][0] for hyps in self.translator.search_batch(batch, self.call)]


class HfEngine:
    """``generate`` on mtkit's ids (a copy of mtkit's model), or on Marian's (``marian``: the folder an
    imported model came from; its ids are mapped in and out, as cheap as the CTranslate2 workers' pieces)."""

    def __init__(self, model, beam: int, n: int, marian: dict | None = None) -> None:
        self.model, self.beam, self.n = model, beam, n
        self.pad, self.eos = (marian["pad"], marian["eos"]) if marian else (PAD_ID, EOS_ID)
        self.to_hf = marian["to_marian"] if marian else None
        self.from_hf = marian["from_marian"] if marian else None

    def __call__(self, batch: list[list[int]]) -> list[list[int]]:
        import torch

        if self.to_hf is not None:
            batch = [[self.to_hf[t] for t in x] for x in batch]
        width = max(map(len, batch))
        ids = torch.tensor([x + [self.pad] * (width - len(x)) for x in batch])
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=ids != self.pad, num_beams=self.beam, do_sample=False,
                min_new_tokens=self.n, max_new_tokens=self.n + 1, forced_eos_token_id=self.eos,
                length_penalty=0.6, early_stopping=False, num_return_sequences=1,
            )
        # Marian's decoder starts from its pad id, mtkit's copy from BOS: row[0] either way.
        outputs = [[t for t in row.tolist()[1:] if t not in (self.pad, self.eos)] for row in out]
        return outputs if self.from_hf is None else [[self.from_hf[t] for t in x] for x in outputs]


class Ct2Engine:
    """CTranslate2 cannot force EOS: it decodes ``n + 1`` tokens with EOS banned throughout."""

    def __init__(self, model_dir: Path, vocab, beam: int, n: int, int8: bool, threads: int) -> None:
        import ctranslate2

        intra, inter = (1, threads) if int8 else (threads, 1)  # int8: one thread per translator is fastest
        self.translator = ctranslate2.Translator(str(model_dir), intra_threads=intra, inter_threads=inter)
        self.inter = inter
        self.vocab, self.beam, self.n = vocab, beam, n
        self.piece_id = {p: i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size)))}

    def __call__(self, batch: list[list[int]]) -> list[list[int]]:
        source = [self.vocab.src_pieces(x[:-1]) for x in batch]  # the model appends EOS
        # Split across the inter-op translators (int8: one thread each) when there are several.
        size = max(1, -(-len(batch) // self.inter))
        results = self.translator.translate_batch(
            source, beam_size=self.beam, length_penalty=0.0, max_batch_size=size, max_input_length=0,
            min_decoding_length=self.n + 1, max_decoding_length=self.n + 1)
        return [[self.piece_id[p] for p in r.hypotheses[0]] for r in results]


class OnnxEngine:
    """mtkit's greedy and beam search over the ONNX graphs, lengths forced as the mtkit worker's."""

    def __init__(self, model, beam: int, n: int) -> None:
        from mtkit.decoding.options import SearchOptions

        self.model, self.beam = model, beam
        self.options = SearchOptions(beam=beam, nbest=1, max_len_a=0.0, max_len_b=n, alpha=0.6, min_len=n)

    def __call__(self, batch: list[list[int]]) -> list[list[int]]:
        import torch

        from mtkit.decoding import search

        width = max(map(len, batch))
        src = torch.tensor([x + [PAD_ID] * (width - len(x)) for x in batch])
        with torch.inference_mode():
            if self.beam == 1:
                hyps = search.greedy_search(self.model, src, self.options)
            else:
                hyps = search.beam_search(self.model, src, self.options)
        return [h[0].tokens for h in hyps]


def engine_factory(name: str, plan: dict, threads: int):
    """A function beam -> engine for ``name``, with the engine's model loaded once."""
    n = plan["forced_len"]
    if name == "mtkit":
        from mtkit.checkpoints.io import load_model

        loaded = load_model(plan["checkpoint"])
        return lambda beam: MtkitEngine(loaded, beam, n)
    if name == "hf":
        import torch
        from transformers import MarianMTModel

        model = MarianMTModel.from_pretrained(plan["hf"]).eval()
        positions = Path(plan["hf"]) / POSITIONS
        if positions.is_file():  # a copy of mtkit's model: mtkit's tables (an OPUS-MT folder keeps Marian's own)
            tables = torch.load(positions, weights_only=True)
            with torch.no_grad():
                for side, table in tables.items():
                    getattr(model.model, side).embed_positions.weight.copy_(table)
        return lambda beam: HfEngine(model, beam, n, plan.get("marian"))
    if name == "onnx":
        from mtkit.engines.onnx_engine import OnnxModel

        model = OnnxModel(plan["onnx"], threads)
        return lambda beam: OnnxEngine(model, beam, n)
    from mtkit.data.vocab import Vocab

    quant = name.removeprefix("ct2-")
    vocab = Vocab.load(Path(plan["ct2"][quant]))
    return lambda beam: Ct2Engine(Path(plan["ct2"][quant]), vocab, beam, n, quant == "int8", threads)


def time_engine(engine, batches: list[list[list[int]]]) -> dict:
    engine(batches[0][:1])  # warm-up
    start = time.perf_counter()
    outputs = [out for batch in batches for out in engine(batch)]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences": len(outputs), "tokens": sum(map(len, outputs)), "outputs": outputs}


def text_side(name: str, plan: dict, threads: int) -> dict:
    """Text in, text out over ``plan['lines']``: two rounds, the second (warm) one timed."""
    text, n = plan["text"], plan["forced_len"]
    model_dir = Path(plan["ct2"]["fp32"])
    lines, beam, budget = plan["lines"], text["beam"], text["budget"]
    if name == "text-mtkit":
        from mtkit.engines.ctranslate2_engine import CpuThreads, Ctranslate2Engine
        from mtkit.engines.engine import EngineOptions

        decode = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=n + 1, min_len=n + 1, batch_tokens=budget)
        ours = Ctranslate2Engine(model_dir, decode, EngineOptions(), CpuThreads(intra=threads))

        def translate() -> list[str]:
            return [t.best.text for t in ours.translate(lines, buffer_size=len(lines))]
    else:
        import ctranslate2
        import sentencepiece

        names = json.loads((model_dir / "mtkit.json").read_text(encoding="utf-8"))["spm"]
        tgt = "spm.tgt.model" if "spm.tgt.model" in names else "spm.model"
        src = "spm.src.model" if "spm.src.model" in names else "spm.model"
        sp_src = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / src))
        sp_tgt = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / tgt))
        direct = ctranslate2.Translator(str(model_dir), intra_threads=threads)

        def translate() -> list[str]:
            pieces = sp_src.encode(lines, out_type=str)
            results = direct.translate_batch(pieces, beam_size=beam, length_penalty=0.0, max_batch_size=budget,
                                             batch_type="tokens", min_decoding_length=n + 1,
                                             max_decoding_length=n + 1, max_input_length=0)
            return [sp_tgt.decode_pieces(r.hypotheses[0]) for r in results]

    translate()  # the first round warms up
    start = time.perf_counter()
    outputs = translate()
    return {"seconds": time.perf_counter() - start, "sentences": len(lines), "outputs": outputs}


def work(name: str, workdir: Path, threads: int) -> None:
    """Run worker ``name`` on ``workdir/plan.json`` and print its JSON line on stdout."""
    plan = json.loads((Path(workdir) / "plan.json").read_text(encoding="utf-8"))
    if name in ("mtkit", "hf", "onnx"):
        import torch

        torch.set_num_threads(threads)
    keep_freed_memory()  # as the mtkit CLI does, in every worker alike
    versions = {}
    if name in TEXT_SIDES:
        results = [text_side(name, plan, threads)]
    elif name in ENGINES:
        make = engine_factory(name, plan, threads)
        results = []
        for beam, label in plan["runs"]:
            engine = make(beam)
            for what in ("batched", "single"):
                if not plan[what]:  # --latency-n 0
                    continue
                results.append({"run": label, "what": what, **time_engine(engine, plan[what])})
    else:
        sys.exit(f"error: unknown worker {name!r}; expected one of {', '.join(ENGINES + TEXT_SIDES)}")
    for module in ("torch", "ctranslate2", "transformers", "onnxruntime"):
        if module in sys.modules:
            versions[module] = getattr(sys.modules[module], "__version__", "?")
    print(json.dumps({"engine": name, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                      "loaded": versions, "results": results}), flush=True)
