"""`mtkit import nllb`: a real M2M100ForConditionalGeneration (random weights, made to depend on its input), a
real SentencePiece model and an NllbTokenizer over it with NLLB-style language codes, saved with save_pretrained:
mtkit translates it exactly as Hugging Face's generate(), in torch and through its CTranslate2 export."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from inprocess import run_mtkit

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")
pytest.importorskip("safetensors")

import torch  # noqa: E402

CODES = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn"]
TARGETS = ["fra_Latn", "deu_Latn"]
MAX_LENGTH = 24  # generation_config.json's; the searches also run cut at CUT_LENGTH
CUT_LENGTH = 8


def _words(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghiklmnoprstu") for _ in range(rng.randint(2, 7))) for _ in range(n)]


WORDS = _words(0, 300)


def _sentences(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10))) for _ in range(n)]


SOURCES = _sentences(1, 60)


def make_nllb(folder: Path, seed: int = 0) -> Path:
    """A tiny NLLB-style folder: config.json, generation_config.json, model.safetensors, sentencepiece.bpe.model,
    tokenizer.json, tokenizer_config.json (the codes after the pieces, as NllbTokenizer numbers them)."""
    import io

    from transformers import AutoTokenizer, GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    folder.mkdir(parents=True)
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(_sentences(2, 400)), model_writer=out,
                                             vocab_size=200, model_type="bpe", character_coverage=1.0,
                                             minloglevel=2)
    (folder / "sentencepiece.bpe.model").write_bytes(out.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "NllbTokenizer", "additional_special_tokens": CODES, "src_lang": "eng_Latn"}))
    tok = AutoTokenizer.from_pretrained(folder)
    config = M2M100Config(
        vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        scale_embedding=True, dropout=0.0, attention_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    # Hugging Face's initialization (std 0.02, unit LayerNorms, zero biases) gives nearly uniform outputs, the same
    # for every input: larger weights, LayerNorms and biases away from 1 and 0, and a larger </s> row make the
    # outputs differ by sentence (50+ distinct strings of 60) and end at different lengths. mtkit never writes
    # <pad> (nor does a trained NLLB: its row is zeros); generate() could, where every other logit is below 0.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + torch.randn_like(p) * 0.2)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
            else:
                p.normal_(0, 0.5)
        model.model.shared.weight[2] *= 2.5
        model.model.shared.weight[1] = 0.0  # <pad>'s row stays zero, as fairseq's padding_idx keeps it in training
    model.generation_config = GenerationConfig(
        decoder_start_token_id=2, eos_token_id=2, pad_token_id=1, bos_token_id=0, forced_eos_token_id=2,
        max_length=MAX_LENGTH, num_beams=4, length_penalty=1.0, early_stopping=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def hf(folder: Path):
    from transformers import AutoTokenizer, M2M100ForConditionalGeneration

    return M2M100ForConditionalGeneration.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(
        folder, src_lang="eng_Latn")


def mtkit(*args, check: bool = True, input: str | None = None):
    done = run_mtkit(*args, stdin=input)
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("nllb")
    folder = make_nllb(root / "hf")
    mtkit("import", "nllb", folder, "-o", root / "run", "--target", TARGETS[0], "-t", "de")  # de: deu_Latn
    return folder, root / "run"


def generate(model, tok, target: str, beam: int, max_length: int) -> list[str]:
    batch = tok(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, forced_bos_token_id=tok.convert_tokens_to_ids(target), num_beams=beam,
                             max_length=max_length)
    return tok.batch_decode(out, skip_special_tokens=True)


def test_the_import_is_a_multilingual_run(built):
    from mtkit.checkpoints.io import load_model

    _, run = built
    loaded = load_model(run / "checkpoints" / "averaged.pt")
    vocab, config = loaded.vocab, loaded.config
    assert (config.data.tag_side, config.data.src_lang) == ("codes", "eng_Latn")
    assert [(p.src_lang, p.tgt_lang) for p in config.data.pairs] == [("eng_Latn", t) for t in TARGETS]
    m = config.model
    assert (m.norm, m.sinusoid_layout, m.scale_embedding, m.share_embeddings, m.activation) == (
        "pre", "fairseq", True, "all", "relu")
    d = config.decode
    assert (d.beam, d.alpha, d.length_penalty, d.max_len_a, d.max_len_b, d.forced_eos) == (
        4, 1.0, "power", 0.0, MAX_LENGTH - 2, "zero")
    # NLLB id -> mtkit id: pad, unk, the start (a copy of </s>), </s>, then <s> and the rest in order
    assert vocab.tgt_pieces([0, 1, 3, 4]) == ["<pad>", "<unk>", "</s>", "<s>"]
    assert vocab.src_piece_id("fra_Latn") is not None


def test_encoder_and_decoder_equal_huggingface(built):
    """Teacher-forced logits through the permutation: the NLLB sentence [code, pieces, </s>] and the decoder's
    [</s>, target code, ...] give the same log-probabilities in both."""
    from mtkit.checkpoints.io import load_model
    from mtkit.data.languages import for_config

    folder, run = built
    model, tok = hf(folder)
    loaded = load_model(run / "checkpoints" / "averaged.pt")
    ours, vocab, config = loaded.model.eval(), loaded.vocab, loaded.config
    coded = for_config(vocab, config, "fra_Latn")
    table = {p: i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size)))}
    hf_of = {i: tok.convert_tokens_to_ids(p) for p, i in table.items() if i != 2}
    hf_of[2] = 2
    for text in SOURCES[:5]:
        ids = coded.encode_src(text) + [3]
        assert [hf_of[i] for i in ids] == tok(text).input_ids
        tgt_in = [2, *coded.decoder_prefix, *ids[1:4]]
        with torch.no_grad():
            theirs = model(input_ids=torch.tensor([tok(text).input_ids]),
                           decoder_input_ids=torch.tensor([[hf_of[i] for i in tgt_in]])).logits.log_softmax(-1)
            memory, mask = ours.encode(torch.tensor([ids]))
            mine = ours.logits(ours.decode(torch.tensor([tgt_in]), memory, mask)).log_softmax(-1)
        order = torch.tensor([hf_of[i] for i in range(3, vocab.tgt_size)])
        torch.testing.assert_close(mine[0, :, 3:], theirs[0][:, order], atol=1e-4, rtol=1e-4)
        assert float(mine[0, :, 2].max()) < -1000  # the start slot takes no probability


@pytest.mark.slow  # 60 sentences × 2 languages × 3 searches in both libraries, and the CTranslate2 export
def test_translate_and_ctranslate2_equal_generate(built, tmp_path):
    pytest.importorskip("ctranslate2")
    import mtkit as api

    folder, run = built
    model, tok = hf(folder)
    mtkit("export", "ctranslate2", run, tmp_path / "ct2")
    engines = {"torch": api.load(run), "ctranslate2": api.load(tmp_path / "ct2", engine="ctranslate2")}
    distinct = set()
    for target in TARGETS:
        for beam, max_length in ((1, MAX_LENGTH), (4, MAX_LENGTH), (4, CUT_LENGTH)):
            expected = generate(model, tok, target, beam, max_length)
            distinct |= set(expected)
            for name, engine in engines.items():
                got = [r.text for r in engine.translate(SOURCES, target=target, beam=beam, max_len_b=max_length - 2,
                                                        split="none", guard=False)]
                assert got == expected, (name, target, beam, max_length)
    assert len(distinct) > 100  # the outputs depend on the sentence and the language
    # the command line: the model's own settings (beam 4, max_length 24) and --tgt-lang
    text = "\n".join(SOURCES) + "\n"
    out = mtkit("translate", "-m", run, "--tgt-lang", "deu_Latn", "--no-guard", "--split", "none", input=text)
    assert out.stdout.splitlines() == generate(model, tok, "deu_Latn", 4, MAX_LENGTH)


def test_the_fairseq_sinusoids_are_m2m100s():
    """model.sinusoid_layout: fairseq is M2M100SinusoidalPositionalEmbedding's table from position 2 on (mtkit computes
    it in float64, Hugging Face in float32: a few 1e-6 apart at the far positions)."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    from mtkit.model import sinusoid_table

    for d_model in (32, 1024):
        theirs = M2M100SinusoidalPositionalEmbedding.get_embedding(130, d_model, padding_idx=1)
        torch.testing.assert_close(sinusoid_table(128, d_model, "fairseq"), theirs[2:130], atol=1e-5, rtol=0)


def test_what_an_import_cannot_do_is_one_line(built, tmp_path):
    """Scoring (its forced code would count) and mtkit export hf (another architecture): refused in one line."""
    _, run = built
    (tmp_path / "src").write_text(SOURCES[0] + "\n")
    for args, word in ((("score", "-m", run, "--src", tmp_path / "src", "--tgt", tmp_path / "src", "--tgt-lang", "fr"),
                        "not supported"),
                       (("export", "hf", run, tmp_path / "hf"), "fairseq")):
        r = mtkit(*args, check=False)
        errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert r.returncode == 1 and len(errors) == 1 and word in errors[0] and "Traceback" not in r.stderr, r.stderr


def _error_line(folder: Path, out: Path, *flags: str) -> str:
    r = mtkit("import", "nllb", folder, "-o", out, *flags, check=False)
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()
    return errors[0]


def test_hostile_folders_are_one_line_before_any_allocation(built, tmp_path, monkeypatch):
    """Sizes that disagree with the tensors, sizes in the billions, deep JSON, unknown codes: one error line each,
    and no model is built (Transformer is never called)."""
    import mtkit.importers.nllb as nllb

    folder, _ = built
    built_models = []
    real = nllb.Transformer
    monkeypatch.setattr(nllb, "Transformer", lambda *a, **k: built_models.append(a) or real(*a, **k))

    def spoiled(name: str, change) -> Path:
        copy = tmp_path / f"hf-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(folder, copy)
        path = copy / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
        return copy

    cases = [
        (spoiled("config.json", lambda c: c.update(d_model=64)), (), "d_model"),
        (spoiled("config.json", lambda c: c.update(encoder_layers=3)), (), "encoder_layers"),
        (spoiled("config.json", lambda c: c.update(vocab_size=3_000_000_000)), (), "vocab_size"),
        (spoiled("config.json", lambda c: c.update(decoder_layers=10**9, d_model=2**31)), (), "config.json"),
        (spoiled("config.json", lambda c: c.update(encoder_ffn_dim=10**10, decoder_ffn_dim=10**10)), (),
         "encoder_ffn_dim"),
        (spoiled("config.json", lambda c: c.update(model_type="marian")), (), "model_type"),
        (spoiled("generation_config.json", lambda c: c.update(num_beams=10**9)), (), "num_beams"),
        (spoiled("tokenizer_config.json", lambda c: c.update(extra_special_tokens=[*CODES, "xho_Latn"])), (),
         "xho_Latn"),
        (spoiled("tokenizer.json", lambda c: c["added_tokens"].append({"id": 10**9, "content": "x", "special": True})),
         (), "tokenizer.json"),
        (folder, ("--target", "xxx_Zzzz"), "xxx_Zzzz"),
        (folder, ("--source", "zzz_Zzzz"), "zzz_Zzzz"),
    ]
    deep = tmp_path / "deep"
    shutil.copytree(folder, deep)
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    cases.append((deep, (), "config.json"))
    for i, (broken, flags, word) in enumerate(cases):
        line = _error_line(broken, tmp_path / f"run-{i}", *flags)
        assert word in line, line
    assert built_models == []
    # every code of the model is a target by default; the source comes from tokenizer_config.json
    from mtkit.importers.nllb import read_nllb

    imported = read_nllb(folder)
    assert [p.tgt_lang for p in imported.config.data.pairs] == CODES[1:]


@pytest.mark.slow  # a server, real searches
def test_serve_constraints_and_alignments_on_an_import(built):
    """What the run gives downstream: serve's /languages in ISO 639-1 codes where the model's codes have one,
    --tgt-lang by either code, an exclude constraint, alignments."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from test_serve_libretranslate import Running

    import mtkit as api
    from mtkit.commands.serve import _served_pairs

    folder, run = built
    model = api.load(run)
    first = model.translate(SOURCES[0], target="fra_Latn", split="none", guard=False)
    assert first.text and model.translate(SOURCES[0], target="fr", split="none", guard=False).text == first.text
    word = first.text.split()[0]
    banned = model.translate(SOURCES[0], target="fra_Latn", split="none", guard=False,
                             constraints=[{"exclude": [word]}])
    assert banned.text and word not in banned.text.split()
    aligned = model.translate(SOURCES[0], target="fra_Latn", split="none", guard=False, alignments="hard")
    assert aligned.text == first.text and aligned.hypotheses[0].alignment

    # distill.teacher's loading and call (mtkit.training.distill): a run imported with one target translates
    # without being told it
    from mtkit.api import LoadOptions, load_models
    from mtkit.importers import write_run
    from mtkit.importers.nllb import read_nllb

    one = write_run(read_nllb(folder, "eng_Latn", ("fra_Latn",)), run.parent / "run-fr")
    teacher = load_models([one], LoadOptions(engine="torch", threads=0, any_target=False)).engine
    assert [r.candidates[0].text for r in teacher.translate(SOURCES[:5])] == [
        r.text for r in model.translate(SOURCES[:5], target="fra_Latn", guard=False, split="none")]

    served = _served_pairs("nllb", run, model.engine, "torch", None, None, None)
    server = Running(served)
    try:
        assert server.json("GET", "/languages")[1] == [{"code": "en", "name": "English", "targets": ["fr", "de"]}]
        status, done = server.post_json("/translate", {"q": SOURCES[0], "source": "en", "target": "fr"})
        guarded = model.translate(SOURCES[0], target="fra_Latn").text  # the server guards, as translate does
        assert status == 200 and done["translatedText"] == guarded
    finally:
        server.stop()
