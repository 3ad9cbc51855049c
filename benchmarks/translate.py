"""Translation speed: mtkit's PyTorch search vs Hugging Face ``generate`` vs CTranslate2, each engine in a
process of its own, under the OpenMP wait policy that suits it.

Translates the 1,000 sentences of Multi30k test_2016 (English side, read from ``--data``, by
default ``$MTKIT_MULTI30K`` or ``../shared/data/multi30k``, never copied) with a randomly
initialized model of the multi30k recipe's shape (``--shape tiny``: d_model 128, 4+4 layers, 4 heads,
FFN 256), a larger one (``--shape small``: d_model 256, 3+3 layers, 4 heads, FFN 1024) or OPUS-MT's
(``--shape opus``, below), with an 8k joint SentencePiece vocabulary trained here on the Multi30k
training text.

The parent (this script) builds everything in a temporary directory: the vocabulary, the model
(seed 1) saved as a real mtkit checkpoint (``mtkit translate -m`` loads it), the same weights
copied into a ``MarianMTModel`` of the same shape (post-norm, ReLU, scaled embeddings, the same
sinusoidal table; ``save_pretrained``), the CTranslate2 exports of ``mtkit export ctranslate2``
(fp32 and int8), and the length-sorted batches of source ids (``--batch`` sentences; and the first
``--latency-n`` sentences one by one) in ``plan.json``. It then starts one worker process per engine
and wait policy (``--worker``, see ``translate_worker.py``): ``OMP_WAIT_POLICY`` unset, and
``PASSIVE`` (``--policies``), ``OMP_NUM_THREADS`` = ``--threads``. A worker loads only its engine
(the CTranslate2 workers never import torch, the torch ones never import ctranslate2), warms up
and times ids in to ids out. PASSIVE stops idle OpenMP threads from spinning, which helps when
other processes hold the cores and slows every wake-up otherwise; which is faster depends on the
engine and the batch size, so each engine is measured both ways and its faster figure is kept:
the ratios are computed from the bests.

``--shape opus`` measures mtkit on an imported Marian model instead: a random ``MarianMTModel`` (seed 1)
of the OPUS-MT shape (d_model 512, 6+6 layers, 8 heads, FFN 2048, swish, ``final_logits_bias`` (small
random values), Marian's sinusoid layout, shared embeddings, 58,101 ids) saved in the OPUS-MT layout:
source.spm = target.spm = the 8k SentencePiece model, vocab.json = its pieces plus filler pieces the
tokenizer never produces, with Marian's special ids (``</s>`` 0, ``<unk>`` 1, ``<pad>`` last), an OPUS-MT
generation_config.json (pad banned, ``renormalize_logits``), tokenizer_config.json. ``mtkit import
marian`` (:mod:`mtkit.importers.marian`) turns it into the run directory the mtkit worker loads and
``mtkit export ctranslate2`` exports; the HF worker runs the Marian folder itself (``from_pretrained``,
Marian's own sinusoids). The sources are encoded with the imported piece table (mtkit's ids, which the
CTranslate2 workers turn into pieces); the HF worker maps them to Marian's ids (the importer permutes
them) and its outputs back, so that every engine gets the same tokens and the outputs compare. One
run: beam 4, batches of 32, and ``--latency-n`` sentences one by one (default 10; 0 leaves them out).
Beside the ratios, it prints whether the issues' targets (``SHAPES[...]['targets']``: how many times as
fast as ``generate`` or CTranslate2 fp32 mtkit should be; #21 for this shape, #25 for the tiny one) hold
in this one run.

Random weights produce random lengths, so every engine is made to produce exactly ``--forced-len``
tokens: EOS is banned before that and every engine runs ``forced-len + 1`` decoder steps (mtkit
and ``generate``: N tokens and a forced EOS; CTranslate2, which cannot force EOS: N+1 tokens).

Two more comparisons, each side in its own processes, under each policy:
  * text in, text out: ``mtkit translate --engine ctranslate2``'s pipeline against CTranslate2
    called directly (SentencePiece encode, ``translate_batch`` on all sentences, decode);
  * whole processes: ``python -m mtkit translate -m CHECKPOINT`` (torch) against ``--engine
    ctranslate2 -m EXPORT`` (fp32), wall time from start to exit, at the shape's beam with at most
    ``--forced-len`` output tokens: all sentences with the default ``--batch-tokens``, and the
    first ``--latency-n`` with ``--batch-tokens 1``. Nothing forces the length here, so the output
    tokens and the lines the two engines agree on are printed beside the times.

    python benchmarks/translate.py                 # tiny shape, greedy and beam 4
    python benchmarks/translate.py --shape small   # beam 5, 20 tokens, batch 32 and 1
    python benchmarks/translate.py --sentences 40 --latency-n 5 --skip hf whole   # a quick look
    python benchmarks/translate.py --shape opus --skip text whole   # issue #21's comparison

Needs ``pip install 'mtkit[bench,export]'`` (transformers, psutil, ctranslate2; the opus shape also
safetensors, ``mtkit[import]``); an engine whose package is missing is left out with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

# The imports above are light on purpose: a worker started through this script loads nothing but its
# engine. translate_worker.py sits beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {
    "tiny": {"model": {"preset": "transformer-tiny", "d_model": 128, "h": 4, "d_ff": 256, "encoder_layers": 4,
                       "decoder_layers": 4},
             "runs": [(1, "greedy"), (4, "beam 4")], "batch": 64, "latency_n": 100,
             # issue #25: batched beam >= 0.8x CTranslate2 fp32, batch-1 beam 4 >= 0.4x, >= 2x HF everywhere
             "targets": [{"issue": 25, "engine": "ct2-fp32", "goal": 0.8, "what": "batched", "run": "beam"},
                         {"issue": 25, "engine": "ct2-fp32", "goal": 0.4, "what": "single", "run": "beam"},
                         {"issue": 25, "engine": "hf", "goal": 2.0}]},
    "small": {"model": {"d_model": 256, "h": 4, "d_ff": 1024, "encoder_layers": 3, "decoder_layers": 3},
              "runs": [(5, "beam 5")], "batch": 32, "latency_n": 100},
    # OPUS-MT's (Helsinki-NLP/opus-mt-*): a MarianMTModel, imported with `mtkit import marian`.
    "opus": {"marian": {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
                        "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048,
                        "vocab_size": 58101, "max_position_embeddings": 512, "activation_function": "swish"},
             "runs": [(4, "beam 4")], "batch": 32, "latency_n": 10,
             # issue #21: mtkit at least this many times as fast as the engine, batched, in one run
             "targets": [{"issue": 21, "engine": "hf", "goal": 1.5, "what": "batched"},
                         {"issue": 21, "engine": "ct2-fp32", "goal": 0.6, "what": "batched"}]},
}
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(os.environ.get("MTKIT_MULTI30K", REPO.parent / "shared/data/multi30k"))
POLICIES = {"default": None, "passive": "PASSIVE"}  # name -> OMP_WAIT_POLICY (None: unset)
NAMES = {"mtkit": "mtkit (PyTorch)", "hf": "HF generate", "ct2-fp32": "CTranslate2 fp32",
         "ct2-int8": "CTranslate2 int8", "text-mtkit": "mtkit --engine ctranslate2",
         "text-direct": "CTranslate2 direct", "onnx": "ONNX Runtime"}


def policy_env(policy: str, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("OMP_WAIT_POLICY", None)
    if POLICIES[policy] is not None:
        env["OMP_WAIT_POLICY"] = POLICIES[policy]
    return env


def policy_label(policy: str) -> str:
    return "unset" if POLICIES[policy] is None else POLICIES[policy]


# ------------------------------------------------------------------------- setup


def build_vocab(data: Path, size: int):
    from mtkit.config import SpmConfig
    from mtkit.data.vocab import Vocab, train_model

    sentences = []
    for name in ("train.en", "train.de"):
        with open(data / name, encoding="utf-8") as f:
            sentences += [line.strip() for line in f if line.strip()]
    return Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=size), threads=os.cpu_count() or 1))


def save_random_checkpoint(cfg, vocab, decode, path: Path) -> Path:
    """A randomly initialized model (seed 1) as a checkpoint that ``mtkit translate -m`` loads."""
    import torch

    from mtkit.checkpoints.io import model_payload, save_checkpoint, vocab_entry
    from mtkit.config import Config, config_to_dict
    from mtkit.model import Transformer

    torch.manual_seed(1)
    model = Transformer(cfg, vocab.src_size, vocab.tgt_size)
    return save_checkpoint(model_payload(config_to_dict(Config(model=cfg, decode=decode)), model.state_dict(),
                                         vocab_entry(vocab), vocab.src_size, vocab.tgt_size), path)


def copy_into_marian(model, vocab_size: int):
    """A MarianMTModel with the same shape and weights as ``model`` (post-norm, tied embeddings)."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    from mtkit.config import BOS_ID, EOS_ID, PAD_ID

    c = model.cfg
    config = MarianConfig(
        vocab_size=vocab_size, d_model=c.d_model, encoder_layers=c.encoder_layers, decoder_layers=c.decoder_layers,
        encoder_attention_heads=c.h, decoder_attention_heads=c.h, encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
        activation_function="relu", max_position_embeddings=c.max_positions, pad_token_id=PAD_ID,
        eos_token_id=EOS_ID, bos_token_id=BOS_ID, decoder_start_token_id=BOS_ID, forced_eos_token_id=EOS_ID,
        scale_embedding=True, share_encoder_decoder_embeddings=True, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, tie_word_embeddings=True,
    )
    hf = MarianMTModel(config).eval()
    sd = {}
    emb = model.encoder.embeddings.tokens.weight
    for key in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight"):
        sd[key] = emb
    sd["final_logits_bias"] = torch.zeros(1, vocab_size)
    for side in ("encoder", "decoder"):
        sd[f"model.{side}.embed_positions.weight"] = getattr(model, side).embeddings.positions.table
    pairs = {"q_proj": "w_q", "k_proj": "w_k", "v_proj": "w_v", "out_proj": "w_o"}

    def linear(prefix, module):
        sd[prefix + ".weight"], sd[prefix + ".bias"] = module.weight, module.bias

    for i, layer in enumerate(model.encoder.layers):
        p = f"model.encoder.layers.{i}"
        for hf_name, name in pairs.items():
            linear(f"{p}.self_attn.{hf_name}", getattr(layer.self_attn, name))
        linear(f"{p}.self_attn_layer_norm", layer.self_attn_norm)
        linear(f"{p}.fc1", layer.feed_forward.w_1)
        linear(f"{p}.fc2", layer.feed_forward.w_2)
        linear(f"{p}.final_layer_norm", layer.feed_forward_norm)
    for i, layer in enumerate(model.decoder.layers):
        p = f"model.decoder.layers.{i}"
        for hf_name, name in pairs.items():
            linear(f"{p}.self_attn.{hf_name}", getattr(layer.self_attn, name))
            linear(f"{p}.encoder_attn.{hf_name}", getattr(layer.cross_attn, name))
        linear(f"{p}.self_attn_layer_norm", layer.self_attn_norm)
        linear(f"{p}.encoder_attn_layer_norm", layer.cross_attn_norm)
        linear(f"{p}.fc1", layer.feed_forward.w_1)
        linear(f"{p}.fc2", layer.feed_forward.w_2)
        linear(f"{p}.final_layer_norm", layer.feed_forward_norm)
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and not [k for k in missing if "positions" not in k], (missing, unexpected)
    return hf


def build_opus_marian(spec: dict, vocab, folder: Path, eos_bias: float | None = None) -> dict[str, int]:
    """A random MarianMTModel of ``spec`` (seed 1) saved in the OPUS-MT layout into ``folder``: returns vocab.json.

    source.spm and target.spm are ``vocab``'s SentencePiece model; vocab.json has Marian's special ids
    (``</s>`` 0, ``<unk>`` 1, ``<pad>`` last), that model's pieces and filler pieces (``<fill_N>``, which
    SentencePiece never produces) up to the vocabulary size. ``final_logits_bias`` and the pad row (the
    decoder's start) are random too; generation_config.json is an OPUS-MT one (beam 4, pad banned,
    ``renormalize_logits``). ``eos_bias``: EOS's output bias instead (a large one with a minimum length: every
    line ends right there, by the model's own choice, in every engine).
    """
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    size = spec["vocab_size"]
    folder.mkdir(parents=True)
    spm_bytes = vocab.model_bytes()[0]
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(spm_bytes)
    table = {"</s>": 0, "<unk>": 1}
    for piece in vocab.src_pieces(range(4, vocab.src_size)):  # mtkit's models: pad, unk, bos, eos = 0..3
        table.setdefault(piece, len(table))
    if len(table) >= size:
        sys.exit(f"error: --vocab {vocab.src_size}: the SentencePiece model must leave room in the "
                 f"{size} Marian ids")
    k = len(table)
    while len(table) < size - 1:
        table.setdefault(f"<fill_{k}>", len(table))
        k += 1
    table["<pad>"] = pad = size - 1
    assert sorted(table.values()) == list(range(size))
    (folder / "vocab.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    config = MarianConfig(
        **spec, decoder_vocab_size=size, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        scale_embedding=True, pad_token_id=pad, eos_token_id=0, bos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=0, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(1)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.1)
        if eos_bias is not None:
            model.final_logits_bias[0, 0] = eos_bias  # </s> is Marian's id 0
        # The decoder starts from the pad row (shared embeddings: one matrix); HF initializes it to zeros.
        model.get_decoder().embed_tokens.weight[pad].normal_(0.0, getattr(config, "init_std", 0.02))
    model.generation_config = GenerationConfig(
        num_beams=4, max_length=512, bad_words_ids=[[pad]], forced_eos_token_id=0, eos_token_id=0, bos_token_id=0,
        pad_token_id=pad, decoder_start_token_id=pad, renormalize_logits=True, early_stopping=True)
    model.save_pretrained(folder)
    del model
    MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                    source_lang="en", target_lang="de").save_pretrained(folder)
    return table


def marian_ids(loaded, table: dict[str, int]) -> dict:
    """mtkit ids <-> Marian ids of an imported model, through the piece table and vocab.json."""
    from mtkit.config import BOS_ID, PAD_ID

    pad, eos = table["<pad>"], table["</s>"]
    pieces = loaded.vocab.src_pieces(range(loaded.vocab.src_size))
    missing = [i for i, p in enumerate(pieces) if p not in table]
    assert missing == [BOS_ID], missing  # BOS carries Marian's decoder start, the pad id
    to_marian = [table.get(p, pad) for p in pieces]
    from_marian = [PAD_ID] * len(table)
    for i, m in enumerate(to_marian):
        if i not in (PAD_ID, BOS_ID):
            from_marian[m] = i
    assert sorted(to_marian[i] for i in range(len(pieces)) if i not in (PAD_ID, BOS_ID)) == \
        [m for m in range(len(table)) if m != pad]
    return {"pad": pad, "eos": eos, "to_marian": to_marian, "from_marian": from_marian}


def prepare(args, work: Path, engines: list[str], lines: list[str]) -> dict:
    """Write the checkpoint, the HF and CTranslate2 copies and ``plan.json`` into ``work``; returns the plan.

    The opus shape starts from the Marian side instead: a random MarianMTModel saved in the OPUS-MT
    layout (the HF worker's model), imported with ``mtkit import marian`` (the mtkit worker's
    checkpoint, and the CTranslate2 exports')."""
    import torch

    from mtkit.checkpoints.io import load_model
    from mtkit.config import EOS_ID, DecodeConfig, ModelConfig

    t0 = time.perf_counter()
    shape = SHAPES[args.shape]
    batch_size = args.batch or shape["batch"]
    n, beam = args.forced_len, shape["runs"][-1][0]
    vocab = build_vocab(args.data, args.vocab)
    if "marian" in shape:
        from transformers.utils import logging as hf_logging

        from mtkit.commands.import_model import import_marian

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        table = build_opus_marian(shape["marian"], vocab, work / "marian")
        checkpoint = work / "imported"
        import_marian(str(work / "marian"), checkpoint)  # `mtkit import marian work/marian -o work/imported`
    else:
        cfg = ModelConfig(**{**shape["model"], "dropout": 0.0})
        decode = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=n)
        checkpoint = save_random_checkpoint(cfg, vocab, decode, work / "model.pt")
    loaded = load_model(checkpoint)  # as `mtkit translate` loads it: the exports start from the same weights
    cfg = loaded.model.cfg
    plan = {"forced_len": n, "runs": shape["runs"], "checkpoint": str(checkpoint), "ct2": {}, "lines": lines,
            "targets": shape.get("targets", [])}
    if "marian" in shape:
        # The HF worker runs the Marian folder itself, in Marian's ids: its batches are mapped on the way.
        if "hf" in engines:
            plan["hf"] = str(work / "marian")
            plan["marian"] = marian_ids(loaded, table)
        vocab = loaded.vocab  # the imported piece table gives the ids every engine gets
    elif "hf" in engines:
        from transformers.utils import logging as hf_logging
        from translate_worker import POSITIONS

        hf_logging.disable_progress_bar()
        plan["hf"] = str(work / "hf")
        copy_into_marian(loaded.model, vocab.tgt_size).save_pretrained(plan["hf"])
        # save_pretrained leaves Marian's sinusoid tables out and from_pretrained rebuilds its own (sines
        # before cosines, where mtkit interleaves them, §3.5): mtkit's go beside the model for the worker.
        torch.save({side: getattr(loaded.model, side).embeddings.positions.table.detach().clone()
                    for side in ("encoder", "decoder")}, work / "hf" / POSITIONS)
    if "ct2-fp32" in engines:
        from mtkit.export.ctranslate2 import export_model

        for quant in ("fp32", "int8"):
            plan["ct2"][quant] = str(export_model(loaded, work / f"ct2-{quant}", None if quant == "fp32" else "int8"))
    if "onnx" in engines:
        from mtkit.export.onnx import export_model as export_onnx

        plan["onnx"] = str(export_onnx(loaded, work / "onnx"))
    src = [ids + [EOS_ID] for ids in vocab.encode_src_batch(lines)]
    order = sorted(range(len(src)), key=lambda i: -len(src[i]))
    plan["batched"] = [[src[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)]
    plan["single"] = [[ids] for ids in src[: args.latency_n]]
    mean_len = sum(map(len, src)) / len(src)
    plan["text"] = {"beam": beam, "budget": int(batch_size * mean_len)}
    (work / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    versions = f"torch {torch.__version__}"
    if "ct2-fp32" in engines:
        import ctranslate2

        versions += f", ctranslate2 {ctranslate2.__version__}"
    if "hf" in engines:
        import transformers

        versions += f", transformers {transformers.__version__}"
    if "onnx" in engines:
        import onnxruntime

        versions += f", onnxruntime {onnxruntime.__version__}"
    detail = ""
    if "marian" in shape:
        filler = sum(p.startswith("<fill_") for p in table)
        detail = (f" ({cfg.activation}, output bias, {cfg.sinusoid_layout} sinusoids; a random MarianMTModel "
                  f"imported by mtkit: {len(table)} Marian ids, {len(table) - 3 - filler} SentencePiece pieces, "
                  f"{filler} filler)")
    print(f"# shape {args.shape}: d_model {cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
          f"{cfg.h} heads, FFN {cfg.d_ff}, vocab {vocab.tgt_size}{detail}; {len(src)} sentences "
          f"(mean {mean_len:.1f} source tokens), {n} output tokens forced; {args.threads} threads; {versions}; "
          f"setup {time.perf_counter() - t0:.0f}s", flush=True)
    return plan


# ----------------------------------------------------------------------- workers


def run_worker(name: str, policy: str, args, work: Path) -> dict | None:
    """Start worker ``name`` under ``policy``; its JSON line, or None (with a note) when it failed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--workdir", str(work),
           "--threads", str(args.threads)]
    proc = subprocess.run(cmd, env=policy_env(policy, args.threads), capture_output=True, text=True,
                          check=False)
    found = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not found:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"note: worker {name}, OMP_WAIT_POLICY {policy_label(policy)}, failed "
              f"(exit {proc.returncode}): {tail}", flush=True)
        return None
    result = json.loads(found[-1])
    wrong = "torch" if name.startswith(("ct2", "text")) else "ctranslate2"
    if wrong in result["loaded"]:
        print(f"note: worker {name} had {wrong} loaded: its figures may suffer from the other OpenMP runtime")
    return result


def print_table(header: list[str], rows: list[list]) -> None:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for k, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def rate(result: dict | None) -> float | None:
    return None if result is None else result["sentences"] / result["seconds"]


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def best_of(by_policy: dict[str, float | None]) -> tuple[float | None, str | None]:
    found = [(v, p) for p, v in by_policy.items() if v is not None]
    return max(found) if found else (None, None)


# ----------------------------------------------------------------------- reports


def report_engines(args, plan: dict, engines: list[str], policies: list[str], work: Path) -> None:
    """One worker per engine and policy; a table per run with each engine's best figure."""
    out = {(e, p): run_worker(e, p, args, work) for e in engines for p in policies}
    n, batch = plan["forced_len"], len(plan["batched"][0])
    findings = []
    whats = [("batched", f"batch {batch}")] + ([("single", "batch 1")] if plan["single"] else [])
    for _, label in plan["runs"]:
        for what, title in whats:
            res = {key: next((x for x in r["results"] if (x["run"], x["what"]) == (label, what)), None) if r else None
                   for key, r in out.items()}
            sents = len(plan["lines"]) if what == "batched" else len(plan["single"])
            print(f"\n## {label}, {title} ({sents} sentences)")
            rates = {e: {p: rate(res[e, p]) for p in policies} for e in engines}
            best = {e: best_of(rates[e]) for e in engines}
            ref_policy = best["mtkit"][1]
            reference = res["mtkit", ref_policy]["outputs"] if ref_policy else None
            rows = []
            for e in engines:
                value, policy = best[e]
                same = "-"
                if reference is not None and policy is not None:
                    outputs = res[e, policy]["outputs"]
                    same = f"{sum(a == b[:n] for a, b in zip(reference, outputs))}/{len(outputs)}"
                ratio = best["mtkit"][0] / value if value and best["mtkit"][0] else None
                tok = res[e, policy]["tokens"] / res[e, policy]["seconds"] if policy else None
                rows.append([NAMES[e], *(fmt(rates[e][p]) for p in policies), fmt(value),
                             policy_label(policy) if policy else "-", fmt(tok, ".0f"), fmt(ratio, ".2f"), same])
                if len(policies) == 2 and None not in rates[e].values():
                    findings.append((e, f"{label}, {title}", rates[e][policies[1]] / rates[e][policies[0]]))
            print_table(["engine", *(f"sent/s {policy_label(p)}" for p in policies), "best", "policy",
                         "tok/s", "mtkit÷", "outputs = mtkit's"], rows)
            for e in engines[1:]:
                if best[e][0] and best["mtkit"][0]:
                    print(f"ratio mtkit / {NAMES[e]}: {best['mtkit'][0] / best[e][0]:.2f}")
            for t in plan.get("targets", []):
                if t.get("what", what) != what or t.get("run", "") not in label:
                    continue
                e, goal = t["engine"], t["goal"]
                if e not in engines or not best[e][0] or not best["mtkit"][0]:
                    print(f"issue #{t['issue']} target mtkit / {NAMES[e]} >= {goal}: not measured")
                    continue
                ratio = best["mtkit"][0] / best[e][0]
                print(f"issue #{t['issue']} target mtkit / {NAMES[e]} >= {goal}: {ratio:.2f}, "
                      f"{'met' if ratio >= goal else 'NOT met'}")
            for e in engines:
                kept = [res[e, p]["outputs"] for p in policies if res[e, p] is not None]
                if len(kept) > 1 and any(o != kept[0] for o in kept[1:]):
                    print(f"note: {NAMES[e]}'s outputs differ between the wait policies")
    if findings:
        a, b = (policy_label(p) for p in policies)
        print(f"\n## OMP_WAIT_POLICY: sent/s with {b} ÷ with {a} (below 1: {b} is slower)")
        columns = list(dict.fromkeys(run for _, run, _ in findings))
        table = {(e, run): r for e, run, r in findings}
        print_table(["engine", *columns], [[NAMES[e], *(fmt(table.get((e, c)), ".2f") for c in columns)]
                                           for e in engines])
        for e in engines:
            ratios = [r for engine, _, r in findings if engine == e]
            if ratios:
                wins = sum(r > 1 for r in ratios)
                print(f"{NAMES[e]}: faster with {b} in {wins} of {len(ratios)} runs "
                      f"({b} ÷ {a}: {min(ratios):.2f}× to {max(ratios):.2f}×)")
        print("(every table above keeps each engine's faster policy; the ratios compare those bests)")


def report_text(args, plan: dict, policies: list[str], work: Path) -> None:
    """Text in, text out: mtkit's CTranslate2 pipeline vs CTranslate2 direct, each side in its own process."""
    text = plan["text"]
    print(f"\n## text in, text out: beam {text['beam']}, {len(plan['lines'])} sentences, "
          f"batches of {text['budget']} source tokens, each side in its own process")
    out = {(s, p): run_worker(s, p, args, work) for s in ("text-mtkit", "text-direct") for p in policies}
    out = {key: (r["results"][0] if r else None) for key, r in out.items()}
    best = {}
    rows = []
    for side in ("text-mtkit", "text-direct"):
        rates = {p: rate(out[side, p]) for p in policies}
        best[side] = best_of(rates)
        rows.append([NAMES[side], *(fmt(rates[p]) for p in policies), fmt(best[side][0]),
                     policy_label(best[side][1]) if best[side][1] else "-"])
    print_table(["pipeline", *(f"sent/s {policy_label(p)}" for p in policies), "best", "policy"], rows)
    (ours, p1), (direct, p2) = best["text-mtkit"], best["text-direct"]
    if ours and direct:
        a, b = out["text-mtkit", p1]["outputs"], out["text-direct", p2]["outputs"]
        print(f"ratio mtkit --engine ctranslate2 / CTranslate2 direct: {ours / direct:.3f} "
              f"(identical lines: {sum(x == y for x, y in zip(a, b))}/{len(a)})")
    print("note: forced to its maximum length, mtkit's pipeline runs CTranslate2's search keeping every "
          "finished hypothesis (2 × beam) and scores the EOS it forces (mtkit/engines/ctranslate2_engine.py)")


def translate_process(model: Path, engine: str, policy: str, src: Path, beam: int, args,
                      extra: list[str]) -> tuple[float, list[str]] | None:
    """Wall seconds of one ``python -m mtkit translate`` process, start to exit, and its output lines."""
    output = src.with_suffix(f".{engine}.{policy}.out")
    cmd = [sys.executable, "-m", "mtkit", "translate", "-m", str(model), "--engine", engine, "--beam", str(beam),
           "--max-len-a", "0", "--max-len-b", str(args.forced_len), "--threads", str(args.threads),
           "--format", "tokens", "-o", str(output), *extra, str(src)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=policy_env(policy, args.threads), capture_output=True, text=True,
                          cwd=src.parent, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"note: mtkit translate --engine {engine} failed (exit {proc.returncode}): {tail}", flush=True)
        return None
    return seconds, output.read_text(encoding="utf-8").splitlines()


def report_whole(args, plan: dict, policies: list[str], work: Path) -> None:
    """Complete ``mtkit translate`` processes, torch against ctranslate2 (fp32), under each policy."""
    beam, lines = plan["text"]["beam"], plan["lines"]
    sides = [("torch", Path(plan["checkpoint"]))]
    if "fp32" in plan["ct2"]:
        sides.append(("ctranslate2", Path(plan["ct2"]["fp32"])))
    cases = [(f"beam {beam}, {len(lines)} sentences, default --batch-tokens", lines, [])]
    if plan["single"]:
        cases.append((f"beam {beam}, first {len(plan['single'])} sentences, --batch-tokens 1",
                      lines[: len(plan["single"])], ["--batch-tokens", "1"]))
    print("\nnote: random weights take every sentence to the maximum length, where the ctranslate2 engine "
          "searches again keeping every finished hypothesis (mtkit/engines/ctranslate2_engine.py); "
          "a trained model seldom gets there")
    for k, (title, text, extra) in enumerate(cases):
        src = work / f"whole{k}.en"
        src.write_text("".join(line + "\n" for line in text), encoding="utf-8")
        print(f"\n## whole process: mtkit translate, {title}, at most {args.forced_len} output tokens; "
              f"wall seconds from start to exit")
        runs = {(e, p): translate_process(model, e, p, src, beam, args, extra) for e, model in sides
                for p in policies}
        best, rows = {}, []
        for engine, _ in sides:
            secs = {p: runs[engine, p][0] if runs[engine, p] else None for p in policies}
            found = [(s, p) for p, s in secs.items() if s is not None]
            best[engine] = min(found) if found else (None, None)
            seconds, policy = best[engine]
            tokens = sum(len(line.split()) for line in runs[engine, policy][1]) if policy else None
            rows.append([f"--engine {engine}", *(fmt(secs[p], ".2f") for p in policies), fmt(seconds, ".2f"),
                         policy_label(policy) if policy else "-",
                         fmt(len(text) / seconds if seconds else None), fmt(tokens, "d")])
        print_table(["engine", *(f"s {policy_label(p)}" for p in policies), "best s", "policy", "sent/s",
                     "output tokens"], rows)
        (t_s, t_p), (c_s, c_p) = best["torch"], best.get("ctranslate2", (None, None))
        if t_s and c_s:
            a, b = runs["torch", t_p][1], runs["ctranslate2", c_p][1]
            print(f"ratio mtkit torch / ctranslate2 engine (speed, whole process): {c_s / t_s:.2f} "
                  f"(identical output lines: {sum(x == y for x, y in zip(a, b))}/{len(a)})")


# -------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="folder holding test_2016_flickr.en and train.{en,de} (default: $MTKIT_MULTI30K "
                             "or ../shared/data/multi30k)")
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--forced-len", type=int, default=20, help="output tokens of every sentence")
    parser.add_argument("--batch", type=int, default=None, help="sentences per batch (tiny 64, small 32, opus 32)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--latency-n", type=int, default=None,
                        help="sentences translated one by one (tiny and small 100, opus 10; 0: none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["hf", "ct2", "onnx", "text", "whole"],
                        help="leave out HF generate, the CTranslate2 engines (and with them the text in, text "
                             "out comparison), ONNX Runtime, that comparison alone, or the whole-process runs")
    parser.add_argument("--policies", default="default,passive",
                        help="OMP_WAIT_POLICY settings to measure, comma-separated: default (unset), passive")
    parser.add_argument("--worker", choices=[*NAMES], help="(started by the parent) run one engine and print JSON")
    parser.add_argument("--workdir", type=Path, help="(with --worker) the parent's directory holding plan.json")
    args = parser.parse_args()
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policies if p not in POLICIES]
    if unknown or not args.policies:
        parser.error(f"--policies: expected a comma-separated list of {', '.join(POLICIES)}")
    if args.worker and args.workdir is None:
        parser.error("--worker needs --workdir")
    if args.latency_n is None:
        args.latency_n = SHAPES[args.shape]["latency_n"]
    if args.latency_n < 0 or args.sentences < 1:
        parser.error("--latency-n must be >= 0 and --sentences >= 1")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        from translate_worker import work

        work(args.worker, args.workdir, args.threads)
        return
    test_file = args.data / "test_2016_flickr.en"
    if not test_file.is_file():
        sys.exit(f"error: {test_file}: no such file (use --data or set MTKIT_MULTI30K)")
    lines = test_file.read_text(encoding="utf-8").splitlines()[: args.sentences]
    engines = ["mtkit"]
    if "marian" in SHAPES[args.shape] and (find_spec("transformers") is None or find_spec("safetensors") is None):
        sys.exit(f"error: --shape {args.shape} builds a MarianMTModel and imports it: it needs transformers "
                 "and safetensors (pip install 'mtkit[bench,import]')")
    if "hf" not in args.skip:
        if find_spec("transformers") is None:
            print("note: transformers is not installed: the HF generate rows are left out")
        else:
            engines.append("hf")
    have_ct2 = "ct2" not in args.skip and find_spec("ctranslate2") is not None
    if "ct2" not in args.skip and not have_ct2:
        print("note: ctranslate2 is not installed: the CTranslate2 rows and comparisons are left out")
    if have_ct2:
        engines += ["ct2-fp32", "ct2-int8"]
    if "onnx" not in args.skip:
        if any(find_spec(m) is None for m in ("onnxruntime", "onnx", "onnxscript")):
            print("note: onnxruntime, onnx or onnxscript is not installed: the ONNX Runtime rows are left out")
        else:
            engines.append("onnx")
    print(f"# each engine in its own process; OMP_WAIT_POLICY measured: "
          f"{', '.join(policy_label(p) for p in args.policies)}; OMP_NUM_THREADS={args.threads}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="mtkit-bench-") as tmp:
        work = Path(tmp)
        plan = prepare(args, work, engines, lines)
        report_engines(args, plan, engines, args.policies, work)
        if have_ct2 and "text" not in args.skip:
            report_text(args, plan, args.policies, work)
        if "whole" not in args.skip:
            report_whole(args, plan, args.policies, work)
    # Other processes on the cores slow the spinning (unset) runs most: say whether there were any.
    print(f"\n# load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
