"""Translation speed: mtkit's PyTorch search vs Hugging Face ``generate`` vs CTranslate2.

Translates the 1,000 sentences of Multi30k test_2016 (English side, read from
``../shared/data/multi30k``, never copied) with a randomly initialized model of
the multi30k recipe's shape (``--shape tiny``: d_model 128, 4+4 layers, 4 heads,
FFN 256) or a larger one (``--shape small``: d_model 256, 3+3 layers, 4 heads,
FFN 1024), with an 8k joint SentencePiece vocabulary trained here on the
Multi30k training text (in a temporary directory).

Random weights produce random lengths, so every engine is made to produce
exactly ``--forced-len`` tokens: EOS is banned before that and every engine runs
``forced-len + 1`` decoder steps (mtkit and ``generate``: N tokens and a forced
EOS; CTranslate2, which cannot force EOS: N+1 tokens). The same weights go into
every engine: copied into a ``MarianMTModel`` of the same shape (post-norm,
ReLU, scaled embeddings, the same sinusoidal table), and exported through
``mtkit export ctranslate2`` (fp32 and int8). All engines get the same batches
(length-sorted, ``--batch`` sentences) of the same token ids, and are timed from
ids in to ids out; "batch 1" runs the first ``--latency-n`` sentences one by one.
A last comparison times text in to text out: ``mtkit translate --engine
ctranslate2``'s pipeline against CTranslate2 called directly (SentencePiece
encode, ``translate_batch`` on all sentences, decode).

    python benchmarks/translate.py                 # tiny shape, greedy and beam 4
    python benchmarks/translate.py --shape small   # beam 5, 20 tokens, batch 32 and 1

Needs ``pip install 'mtkit[bench,export]'`` (transformers, psutil, ctranslate2).
"""

from __future__ import annotations

# CTranslate2 before torch: imported after torch has run multi-threaded work, it
# binds to torch's OpenMP runtime and runs several times slower.
try:
    import ctranslate2
except ImportError:  # the CTranslate2 rows are skipped
    ctranslate2 = None

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, Config, DecodeConfig, ModelConfig, SpmConfig  # noqa: E402
from mtkit.data.vocab import Vocab, train_model  # noqa: E402
from mtkit.host_memory import keep_freed_memory  # noqa: E402
from mtkit.model import Transformer  # noqa: E402
from mtkit.runtime.torch_engine import Translator  # noqa: E402

SHAPES = {
    "tiny": dict(model=dict(preset="transformer-tiny", d_model=128, h=4, d_ff=256, encoder_layers=4, decoder_layers=4),
                 runs=[(1, "greedy"), (4, "beam 4")], batch=64),
    "small": dict(model=dict(d_model=256, h=4, d_ff=1024, encoder_layers=3, decoder_layers=3),
                  runs=[(5, "beam 5")], batch=32),
}
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared/data/multi30k"


def build_vocab(data: Path, size: int) -> Vocab:
    sentences = []
    for name in ("train.en", "train.de"):
        with open(data / name, encoding="utf-8") as f:
            sentences += [line.strip() for line in f if line.strip()]
    return Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=size), threads=os.cpu_count() or 1))


# ----------------------------------------------------------------------- engines


class MtkitEngine:
    name = "mtkit (PyTorch)"

    def __init__(self, loaded, beam: int, n: int) -> None:
        decode = DecodeConfig(beam=beam, nbest=1, max_len_a=0.0, max_len_b=n, alpha=0.6)
        self.translator = Translator(loaded, decode, min_len=n)

    def __call__(self, batch: list[list[int]]) -> list[list[int]]:
        return [hyps[0][0] for hyps in self.translator.search_batch(batch)]


class HfEngine:
    name = "HF generate"

    def __init__(self, model, beam: int, n: int) -> None:
        self.model, self.beam, self.n = model, beam, n

    def __call__(self, batch: list[list[int]]) -> list[list[int]]:
        width = max(map(len, batch))
        ids = torch.tensor([x + [PAD_ID] * (width - len(x)) for x in batch])
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=ids != PAD_ID, num_beams=self.beam, do_sample=False,
                min_new_tokens=self.n, max_new_tokens=self.n + 1, forced_eos_token_id=EOS_ID,
                length_penalty=0.6, early_stopping=False, num_return_sequences=1,
            )
        return [[t for t in row.tolist()[1:] if t not in (PAD_ID, EOS_ID)] for row in out]


class Ct2Engine:
    def __init__(self, model_dir: Path, vocab: Vocab, beam: int, n: int, int8: bool, threads: int) -> None:
        self.name = "CTranslate2 int8" if int8 else "CTranslate2 fp32"
        intra, inter = (1, threads) if int8 else (threads, 1)
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


def copy_into_marian(model: Transformer, vocab_size: int):
    """A MarianMTModel with the same shape and weights as ``model`` (post-norm, tied embeddings)."""
    from transformers import MarianConfig, MarianMTModel

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
        linear(f"{p}.self_attn_layer_norm", layer.sublayer[0].norm)
        linear(f"{p}.fc1", layer.feed_forward.w_1)
        linear(f"{p}.fc2", layer.feed_forward.w_2)
        linear(f"{p}.final_layer_norm", layer.sublayer[1].norm)
    for i, layer in enumerate(model.decoder.layers):
        p = f"model.decoder.layers.{i}"
        for hf_name, name in pairs.items():
            linear(f"{p}.self_attn.{hf_name}", getattr(layer.self_attn, name))
            linear(f"{p}.encoder_attn.{hf_name}", getattr(layer.cross_attn, name))
        linear(f"{p}.self_attn_layer_norm", layer.sublayer[0].norm)
        linear(f"{p}.encoder_attn_layer_norm", layer.sublayer[1].norm)
        linear(f"{p}.fc1", layer.feed_forward.w_1)
        linear(f"{p}.fc2", layer.feed_forward.w_2)
        linear(f"{p}.final_layer_norm", layer.sublayer[2].norm)
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and not [k for k in missing if "positions" not in k], (missing, unexpected)
    return hf


# ------------------------------------------------------------------------ timing


def run(engine, batches: list[list[list[int]]]) -> tuple[float, int, list[list[int]]]:
    engine(batches[0][:1])  # warm-up
    start = time.perf_counter()
    outputs = [out for batch in batches for out in engine(batch)]
    seconds = time.perf_counter() - start
    return seconds, sum(map(len, outputs)), outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding test_2016_flickr.en")
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--forced-len", type=int, default=20, help="output tokens of every sentence")
    parser.add_argument("--batch", type=int, default=None, help="sentences per batch (tiny 64, small 32)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--latency-n", type=int, default=100, help="sentences translated one by one")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["hf", "ct2"], help="engines to leave out")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the mtkit CLI does; the same for every engine of this process
    shape = SHAPES[args.shape]
    batch_size = args.batch or shape["batch"]
    n = args.forced_len
    test_file = args.data / "test_2016_flickr.en"
    if not test_file.is_file():
        sys.exit(f"error: {test_file}: no such file (use --data)")
    lines = test_file.read_text(encoding="utf-8").splitlines()[: args.sentences]

    t0 = time.perf_counter()
    vocab = build_vocab(args.data, args.vocab)
    cfg = ModelConfig(**{**shape["model"], "dropout": 0.0})
    torch.manual_seed(1)
    model = Transformer(cfg, vocab.src_size, vocab.tgt_size).eval()
    loaded = SimpleNamespace(model=model, vocab=vocab, config=Config(model=cfg), path=Path("random.pt"))
    src = [ids + [EOS_ID] for ids in vocab.encode_src_batch(lines)]
    order = sorted(range(len(src)), key=lambda i: -len(src[i]))
    batched = [[src[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)]
    single = [[ids] for ids in src[: args.latency_n]]
    print(f"# shape {args.shape}: d_model {cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
          f"{cfg.h} heads, FFN {cfg.d_ff}, vocab {vocab.tgt_size}; {len(src)} sentences "
          f"(mean {sum(map(len, src)) / len(src):.1f} source tokens), {n} output tokens forced; "
          f"{args.threads} threads; torch {torch.__version__}"
          + (f", ctranslate2 {ctranslate2.__version__}" if ctranslate2 else "")
          + f"; setup {time.perf_counter() - t0:.0f}s", flush=True)

    hf = None if "hf" in args.skip else copy_into_marian(model, vocab.tgt_size)
    tmp = tempfile.TemporaryDirectory(prefix="mtkit-bench-")
    ct2_dirs = {}
    if ctranslate2 is not None and "ct2" not in args.skip:
        from mtkit.export.ctranslate2 import export_model

        for quant in ("fp32", "int8"):
            ct2_dirs[quant] = export_model(loaded, Path(tmp.name) / quant, None if quant == "fp32" else "int8")

    for beam, label in shape["runs"]:
        engines = [MtkitEngine(loaded, beam, n)]
        if hf is not None:
            engines.append(HfEngine(hf, beam, n))
        for quant, path in ct2_dirs.items():
            engines.append(Ct2Engine(path, vocab, beam, n, quant == "int8", args.threads))
        for batches, what in ((batched, f"batch {batch_size}"), (single, "batch 1")):
            print(f"\n## {label}, {what} ({sum(map(len, batches))} sentences)")
            print(f"{'engine':<20} {'sent/s':>9} {'tok/s':>9} {'mtkit ×':>8}  outputs = mtkit's")
            rates, reference = {}, None
            for engine in engines:
                seconds, tokens, outputs = run(engine, batches)
                sents = sum(map(len, batches))
                rates[engine.name] = sents / seconds
                if reference is None:
                    reference = outputs
                same = sum(a == b[:n] for a, b in zip(reference, outputs))
                print(f"{engine.name:<20} {sents / seconds:9.1f} {tokens / seconds:9.0f} "
                      f"{rates[engine.name] / rates[engines[0].name]:8.2f}  {same}/{sents}", flush=True)
            base = rates[engines[0].name]
            for name, rate in rates.items():
                if name != engines[0].name:
                    print(f"ratio mtkit / {name}: {base / rate:.2f}")

    if "fp32" in ct2_dirs:
        compare_pipeline(ct2_dirs["fp32"], vocab, lines, shape["runs"][-1][0], n, args.threads, batch_size)
    tmp.cleanup()


def compare_pipeline(model_dir: Path, vocab: Vocab, lines: list[str], beam: int, n: int, threads: int,
                     batch_size: int) -> None:
    """Text in, text out: ``mtkit translate --engine ctranslate2`` vs CTranslate2 called directly."""
    from mtkit.runtime.ctranslate2_engine import Ctranslate2Translator

    mean_len = sum(len(x) + 1 for x in vocab.encode_src_batch(lines)) / len(lines)
    budget = int(batch_size * mean_len)
    decode = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=n + 1, batch_tokens=budget)
    ours = Ctranslate2Translator(model_dir, decode, intra_threads=threads, min_len=n + 1)
    direct = ctranslate2.Translator(str(model_dir), intra_threads=threads)
    sp = vocab._tgt

    def via_mtkit() -> list[str]:
        return [t.best.text for t in ours.translate(lines, buffer_size=len(lines))]

    def via_direct() -> list[str]:
        pieces = sp.encode(lines, out_type=str)
        results = direct.translate_batch(pieces, beam_size=beam, length_penalty=0.0, max_batch_size=budget,
                                         batch_type="tokens", min_decoding_length=n + 1,
                                         max_decoding_length=n + 1, max_input_length=0)
        return [sp.decode_pieces(r.hypotheses[0]) for r in results]

    print(f"\n## text in, text out: beam {beam}, {len(lines)} sentences, batches of {budget} source tokens")
    times = {}
    for name, fn in (("mtkit --engine ctranslate2", via_mtkit), ("CTranslate2 direct", via_direct)) * 2:
        start = time.perf_counter()
        fn()
        times[name] = time.perf_counter() - start  # the second round (warm) is kept
    for name, seconds in times.items():
        print(f"{name:<28} {len(lines) / seconds:9.1f} sent/s")
    ratio = times["CTranslate2 direct"] / times["mtkit --engine ctranslate2"]
    print(f"ratio mtkit --engine ctranslate2 / CTranslate2 direct: {ratio:.3f}")


if __name__ == "__main__":
    main()
