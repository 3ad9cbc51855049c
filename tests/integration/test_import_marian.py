"""`mtkit import marian`: a real MarianMTModel (random weights) and real SentencePiece models, saved with
save_pretrained in the OPUS-MT layout, translate in mtkit exactly as in Hugging Face transformers."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import run_mtkit

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

import torch  # noqa: E402

from mtkit.checkpoints.io import load_model  # noqa: E402
from mtkit.config import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from mtkit.data.synthetic import english, german  # noqa: E402
from mtkit.decoding.options import SearchOptions  # noqa: E402
from mtkit.decoding.search import beam_search, greedy_search  # noqa: E402

SOURCES = [english(n) for n in (5, 17, 342, 999, 40, 1, 77, 610, 123, 858, 21, 404, 3, 66, 720, 12, 95, 250, 8, 501)]
TARGETS = [german(n) for n in (5, 17, 342, 999, 40, 1, 77, 610, 123, 858, 21, 404, 3, 66, 720, 12, 95, 250, 8, 501)]
MAX_LENGTH = 40  # generation_config.json's, which no output reaches here; searches also run cut at CUT_LENGTH
CUT_LENGTH = 6
# A piece the source SentencePiece model has and vocab.json leaves out: the tokenizer makes it <unk>.
DROPPED = "▁hundred"


def _spm(sentences: list[str], size: int) -> bytes:
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=out, vocab_size=size,
                                             model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    return out.getvalue()


def _pieces(model: bytes) -> list[str]:
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]


def make_marian(folder: Path, activation: str = "swish", shared: bool = True, renormalize: bool = True,
                seed: int = 0) -> Path:
    """A tiny OPUS-MT style folder: config.json, generation_config.json, model.safetensors, source.spm,
    target.spm, vocab.json (one table, or vocab.json + target_vocab.json), tokenizer_config.json."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True)
    src_spm = _spm([english(n) for n in range(0, 1000, 7)], 60)
    tgt_spm = _spm([german(n) for n in range(0, 1000, 7)], 70)
    (folder / "source.spm").write_bytes(src_spm)
    (folder / "target.spm").write_bytes(tgt_spm)

    def table(pieces: list[str], pad: int | None = None) -> dict[str, int]:
        """Marian's: </s> 0, <unk> 1, the pieces, <pad> last (or at ``pad``: Hugging Face's Marian has one
        pad id for both sides, so a larger target vocabulary has pieces after it)."""
        pieces = ["</s>", "<unk>", *(p for p in dict.fromkeys(pieces) if p != DROPPED)]
        pieces.insert(len(pieces) if pad is None else pad, "<pad>")
        return {p: i for i, p in enumerate(pieces)}

    if shared:
        src_vocab = tgt_vocab = table(_pieces(src_spm) + _pieces(tgt_spm))
    else:
        src_vocab = table(_pieces(src_spm))
        tgt_vocab = table(_pieces(tgt_spm), pad=len(src_vocab) - 1)
        assert len(tgt_vocab) > len(src_vocab)
    (folder / "vocab.json").write_text(json.dumps(src_vocab))
    if not shared:
        (folder / "target_vocab.json").write_text(json.dumps(tgt_vocab))
    pad = len(src_vocab) - 1
    config = MarianConfig(
        vocab_size=len(src_vocab), decoder_vocab_size=len(tgt_vocab), share_encoder_decoder_embeddings=shared,
        d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, activation_function=activation,
        scale_embedding=True, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
        dropout=0.0)
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)  # HF's is zeros: this one shows it is imported
    model.generation_config = GenerationConfig(
        num_beams=4, max_length=MAX_LENGTH, bad_words_ids=[[pad]], forced_eos_token_id=0, eos_token_id=0,
        pad_token_id=pad, decoder_start_token_id=pad, renormalize_logits=renormalize, early_stopping=True,
        length_penalty=1.0)
    _train(model, folder)
    with torch.no_grad():  # the decoder starts from the pad row: not zeros here, to show it is carried over
        model.get_decoder().embed_tokens.weight[pad].normal_(0.0, 0.1)
    model.save_pretrained(folder)
    target_vocab = None
    if not shared:
        target_vocab = str(folder / "target_vocab.json")
    MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                    target_vocab_file=target_vocab, separate_vocabs=not shared, source_lang="en",
                    target_lang="de").save_pretrained(folder)
    return folder


def _train(model, folder: Path, steps: int = 120) -> None:
    """A few Adam steps of English number words -> German on the model, with the tokenizer's ids: a
    random model's outputs end either at once or never; a briefly trained one ends at varied lengths."""
    from transformers import MarianTokenizer

    separate = (folder / "target_vocab.json").is_file()
    tok = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                          target_vocab_file=str(folder / "target_vocab.json") if separate else None,
                          separate_vocabs=separate)
    numbers = list(range(0, 1000, 3))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        pick = [numbers[i] for i in torch.randint(len(numbers), (32,), generator=g).tolist()]
        batch = tok([english(n) for n in pick], text_target=[german(n) for n in pick], return_tensors="pt",
                    padding=True)
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == model.config.pad_token_id, -100)
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def hf(folder: Path):
    from transformers import MarianMTModel, MarianTokenizer

    return MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder)


def mtkit(*args: str, check: bool = True, input: str | None = None,
          env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process, or with ``env`` a real one (huggingface_hub reads its settings once, when it is
    imported); ``check``: a non-zero exit raises CalledProcessError."""
    if env is None:
        done = run_mtkit(*args, stdin=input)
    else:
        done = subprocess.run([sys.executable, "-m", "mtkit", *map(str, args)], capture_output=True, text=True,
                              input=input, env=env)
    if check:
        done.check_returncode()
    return done


def import_run(folder: Path, out: Path) -> Path:
    from mtkit.importers import write_run
    from mtkit.importers.marian import read_marian

    return write_run(read_marian(folder), out)


CASES = {
    "swish-shared": dict(activation="swish", shared=True, renormalize=True),
    "relu-shared": dict(activation="relu", shared=True, renormalize=False),
    "gelu-separate": dict(activation="gelu", shared=False, renormalize=True),
}
_BUILT: dict = {}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    name = request.param
    if name not in _BUILT:
        root = tmp_path_factory.mktemp(name)
        folder = make_marian(root / "hf", **CASES[name])
        _BUILT[name] = (folder, import_run(folder, root / "run"))
    return _BUILT[name]


def _marian_ids(vocab, side: str, ids: list[int], table: dict[str, int]) -> list[int]:
    """mtkit ids -> Marian ids, through the pieces."""
    pieces = vocab.src_pieces(ids) if side == "src" else vocab.tgt_pieces(ids)
    return [table[p] for p in pieces]


def test_encoding_and_logits_equal_huggingface(case):
    folder, run = case
    model, tok = hf(folder)
    loaded = load_model(run)
    vocab = loaded.vocab
    separate = (folder / "target_vocab.json").is_file()
    src_table = json.loads((folder / "vocab.json").read_text())
    tgt_table = json.loads((folder / ("target_vocab.json" if separate else "vocab.json")).read_text())
    batch = tok(SOURCES, text_target=TARGETS, return_tensors="pt", padding=True)
    src_ids = [vocab.encode_src(s) + [EOS_ID] for s in SOURCES]
    tgt_ids = [vocab.encode_tgt(t) + [EOS_ID] for t in TARGETS]
    assert any(vocab.src_pieces(ids).count("<unk>") for ids in src_ids), "no source piece missing from vocab.json"
    for i in range(len(SOURCES)):
        hf_src = [x for x in batch["input_ids"][i].tolist() if x != model.config.pad_token_id]
        hf_tgt = [x for x in batch["labels"][i].tolist() if x not in (model.config.pad_token_id, -100)]
        assert _marian_ids(vocab, "src", src_ids[i], src_table) == hf_src
        assert _marian_ids(vocab, "tgt", tgt_ids[i], tgt_table) == hf_tgt

    S, T = max(map(len, src_ids)), max(map(len, tgt_ids))
    src = torch.full((len(SOURCES), S), PAD_ID)
    tgt_in = torch.full((len(SOURCES), T), PAD_ID)
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        src[i, : len(s)] = torch.tensor(s)
        tgt_in[i, : len(t)] = torch.tensor([BOS_ID, *t[:-1]])
    labels = batch["labels"].clone()
    start = torch.full((len(SOURCES), 1), model.config.decoder_start_token_id)
    decoder_input = torch.cat([start, labels[:, :-1].masked_fill(labels[:, :-1] == -100, model.config.pad_token_id)], 1)
    with torch.no_grad():
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=decoder_input).logits  # (B, T, V_marian)
        ours = loaded.model(src, tgt_in)  # (B, T', V_mtkit)
    # Marian's columns in mtkit's order: every real piece (the pad is never a target).
    cols = [tgt_table[p] for p in vocab.tgt_pieces(range(vocab.tgt_size)) if p in tgt_table and p != "<pad>"]
    our_cols = [i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size))) if p in tgt_table and p != "<pad>"]
    for i, t in enumerate(tgt_ids):
        n = len(t)
        diff = (ours[i, :n][:, our_cols] - theirs[i, :n][:, cols]).abs().max().item()
        assert diff < 1e-4, (i, diff)


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("max_length", [MAX_LENGTH, CUT_LENGTH])
def test_search_equals_generate(case, beam, max_length):
    folder, run = case
    model, tok = hf(folder)
    loaded = load_model(run)
    vocab = loaded.vocab
    separate = (folder / "target_vocab.json").is_file()
    tgt_table = json.loads((folder / ("target_vocab.json" if separate else "vocab.json")).read_text())
    d = loaded.config.decode
    assert (d.beam, d.length_penalty, d.alpha, d.max_len_a, d.max_len_b, d.forced_eos) == \
        (4, "power", 1.0, 0.0, MAX_LENGTH - 2, "zero")
    batch = tok(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=beam, max_length=max_length)
    src_ids = [vocab.encode_src(s) + [EOS_ID] for s in SOURCES]
    src = torch.full((len(SOURCES), max(map(len, src_ids))), PAD_ID)
    for i, s in enumerate(src_ids):
        src[i, : len(s)] = torch.tensor(s)
    common = dict(max_len_a=d.max_len_a, max_len_b=max_length - 2, alpha=d.alpha, length_penalty=d.length_penalty,
                  forced_eos=d.forced_eos)
    if beam == 1:
        hyps = greedy_search(loaded.model, src, SearchOptions(**common))
    else:
        hyps = beam_search(loaded.model, src, SearchOptions(beam=beam, **common))
    lengths = set()
    for i, sentence in enumerate(hyps):
        theirs = [x for x in out[i].tolist()[1:] if x != model.config.pad_token_id]
        ours = _marian_ids(vocab, "tgt", sentence[0].tokens, tgt_table) + [0]
        assert ours == theirs, (i, ours, theirs)
        lengths.add(len(ours))
    assert len(lengths) >= (3 if max_length == MAX_LENGTH else 2)  # outputs of varied lengths
    assert max_length == MAX_LENGTH or max_length - 1 in lengths  # some cut at the maximum length


@pytest.mark.slow  # real mtkit processes
def test_cli_translate_and_ctranslate2_export(case, tmp_path):
    pytest.importorskip("ctranslate2")
    folder, run = case
    model, tok = hf(folder)
    batch = tok(SOURCES, return_tensors="pt", padding=True)
    text = "\n".join(SOURCES) + "\n"
    mtkit("export", "ctranslate2", run, tmp_path / "ct2")
    for max_length in (MAX_LENGTH, CUT_LENGTH):
        with torch.no_grad():
            out = model.generate(**batch, max_length=max_length)
        expected = tok.batch_decode(out, skip_special_tokens=True)
        cut = [] if max_length == MAX_LENGTH else ["--max-len-b", str(max_length - 2)]
        torch_out = mtkit("translate", "-m", run, *cut, "--no-guard", input=text).stdout.splitlines()
        assert len(torch_out) == len(SOURCES)
        # MarianTokenizer spells an <unk> as "<unk>", SentencePiece as " ⁇ ": compare where there is none.
        same = [a == b for a, b in zip(torch_out, expected) if "<unk>" not in b]
        assert same and all(same)
        ct2_out = mtkit("translate", "--engine", "ctranslate2", "-m", tmp_path / "ct2", *cut, "--no-guard",
                        input=text).stdout.splitlines()
        assert ct2_out == torch_out


@pytest.mark.slow  # real mtkit processes
def test_import_errors_are_one_line_and_write_nothing(tmp_path):
    import shutil

    folder = tmp_path / "hf"
    if "swish-shared" in _BUILT:
        shutil.copytree(_BUILT["swish-shared"][0], folder)
    else:
        make_marian(folder)
    for name, spoil in (("vocab.json", lambda p: p.unlink()), ("config.json", lambda p: p.write_text("{not json")),
                        ("model.safetensors", lambda p: p.write_bytes(b"garbage")),
                        ("source.spm", lambda p: p.write_bytes(b"garbage"))):
        broken = tmp_path / f"broken-{name}"
        shutil.copytree(folder, broken)
        spoil(broken / name)
        out = tmp_path / f"run-{name}"
        r = mtkit("import", "marian", broken, "-o", out, check=False)
        assert r.returncode == 1, r.stderr
        lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and name in lines[0] and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".run-{name}")]
    # pytorch_model.bin (read with weights_only=True) imports as model.safetensors does.
    from safetensors.torch import load_file

    from mtkit.importers.marian import read_marian

    binary = tmp_path / "bin"
    shutil.copytree(folder, binary)
    torch.save(load_file(str(binary / "model.safetensors")), binary / "pytorch_model.bin")
    (binary / "model.safetensors").unlink()
    a, b = read_marian(folder).state, read_marian(binary).state
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # ... and is read in bounded work first, as checkpoints are: a compressed entry (a zip bomb's way)
    # is one error line before torch.load inflates anything.
    import zipfile

    bomb = tmp_path / "bomb"
    shutil.copytree(binary, bomb)
    with zipfile.ZipFile(binary / "pytorch_model.bin") as src, \
            zipfile.ZipFile(bomb / "pytorch_model.bin", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    r = mtkit("import", "marian", bomb, "-o", tmp_path / "bomb-run", check=False)
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "pytorch_model.bin" in errors[0] and "compressed" in errors[0], errors[0]
    r = mtkit("import", "marian", tmp_path / "nowhere", "-o", tmp_path / "run", check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


@pytest.mark.slow  # real training, in processes
def test_an_imported_model_fine_tunes(tmp_path):
    """prepare --vocab-from the imported run (its piece table), then train --init-from it: the NLL falls
    and the fine-tuned checkpoint keeps the imported vocabulary."""
    from mtkit.data.synthetic import english, german

    if "swish-shared" not in _BUILT:
        folder = make_marian(tmp_path / "hf")
        _BUILT["swish-shared"] = (folder, import_run(folder, tmp_path / "run"))
    run = _BUILT["swish-shared"][1]
    text = tmp_path / "text"
    text.mkdir()
    for split, numbers in (("train", range(0, 1000, 2)), ("valid", range(1, 1000, 37))):
        (text / f"{split}.en").write_text("\n".join(english(n) for n in numbers) + "\n")
        (text / f"{split}.de").write_text("\n".join(german(n) for n in numbers) + "\n")
    prepare = ("prepare", "--src", text / "train.en", "--tgt", text / "train.de", "--valid-src", text / "valid.en",
               "--valid-tgt", text / "valid.de", "--src-lang", "en", "--tgt-lang", "de", "--vocab-from", run,
               "-o", tmp_path / "data")
    mtkit(*prepare)
    mtkit(*prepare, "--force")  # its piece table (pieces.json) is one of prepare's own files
    ft = tmp_path / "ft"
    mtkit("train", "-d", tmp_path / "data", "-r", ft, "--init-from", run, "--set", "train.max_steps=40",
          "--set", "train.log_every=10", "--set", "train.warmup=0", "--set", "train.lr_schedule=inverse_sqrt",
          "--set", "train.lr=0.003", "--set", "train.max_tokens=500", "--set", "train.valid_every=0")
    nll = [r["nll"] for r in map(json.loads, (ft / "metrics.jsonl").read_text().splitlines()) if "nll" in r]
    assert len(nll) == 4 and nll[-1] < nll[0]
    parent, child = load_model(run).vocab, load_model(ft).vocab
    assert child.pieces() == parent.pieces() and child.model_bytes() == parent.model_bytes()
    assert child.encode_src(SOURCES[2]) == parent.encode_src(SOURCES[2])


@pytest.mark.slow  # real mtkit processes
def test_a_hub_name_imports_through_huggingface_hub(case, tmp_path):
    """`mtkit import marian ORG/NAME` goes through huggingface_hub's snapshot_download. No network here: the
    folder is laid out as the hub's cache holds a downloaded snapshot (refs/main naming the commit, the files
    under snapshots/COMMIT), and HF_HUB_OFFLINE=1 makes huggingface_hub answer from that cache, by its own code.
    A name missing from the cache is a one-line error that writes nothing."""
    import os
    import shutil

    pytest.importorskip("huggingface_hub")
    folder, local_run = case
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--Tiny--opus-mt-en-de"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}

    r = mtkit("import", "marian", "Tiny/opus-mt-en-de", "-o", tmp_path / "run", env=env)
    assert "from the Hugging Face hub" in r.stderr
    text = "\n".join(SOURCES) + "\n"
    # the imported runs are local folders: translating them reads no hub settings (in this process)
    via_hub = mtkit("translate", "-m", tmp_path / "run", "--beam", "2", input=text).stdout
    via_folder = mtkit("translate", "-m", local_run, "--beam", "2", input=text).stdout
    assert via_hub == via_folder and len(via_hub.splitlines()) == len(SOURCES)

    r = mtkit("import", "marian", "Tiny/opus-mt-en-fr", "-o", tmp_path / "missing", check=False, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert [x for x in r.stderr.splitlines() if x.startswith("error:")][0].startswith("error: Tiny/opus-mt-en-fr")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("beam", [1, 4])
def test_the_default_max_length_is_generates(case, tmp_path, beam):
    """A generation_config.json without max_length: generate() then writes at most 20 new tokens (its default
    max_length of 20 counts the decoder start; transformers adds the start to a default), the last the EOS
    that forced_eos_token_id forces, so 19 before it; the import allows as many (it allowed 18). Here every
    output is cut there: EOS is made improbable, and both sides agree token for token at the limit."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hf"
    shutil.copytree(case[0], folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    del generation["max_length"]
    (folder / "generation_config.json").write_text(json.dumps(generation))
    weights = load_file(str(folder / "model.safetensors"))
    weights["final_logits_bias"][0, 0] -= 50.0  # Marian's EOS (id 0): never chosen, only forced
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    run = import_run(folder, tmp_path / "run")

    model, tok = hf(folder)
    loaded = load_model(run)
    d = loaded.config.decode
    assert (d.max_len_a, d.max_len_b) == (0.0, 19)
    batch = tok(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=beam)  # the default max_length
    vocab = loaded.vocab
    separate = (folder / "target_vocab.json").is_file()
    tgt_table = json.loads((folder / ("target_vocab.json" if separate else "vocab.json")).read_text())
    src_ids = [vocab.encode_src(s) + [EOS_ID] for s in SOURCES]
    src = torch.full((len(SOURCES), max(map(len, src_ids))), PAD_ID)
    for i, s in enumerate(src_ids):
        src[i, : len(s)] = torch.tensor(s)
    common = dict(max_len_a=d.max_len_a, max_len_b=d.max_len_b, alpha=d.alpha, length_penalty=d.length_penalty,
                  forced_eos=d.forced_eos)
    hyps = (greedy_search(loaded.model, src, SearchOptions(**common)) if beam == 1
            else beam_search(loaded.model, src, SearchOptions(beam=beam, **common)))
    for i, sentence in enumerate(hyps):
        theirs = out[i].tolist()[1:]
        assert len(theirs) == 20 and theirs[-1] == 0, theirs  # 19 tokens and the forced EOS
        ours = _marian_ids(vocab, "tgt", sentence[0].tokens, tgt_table) + [0]
        assert ours == theirs, (i, ours, theirs)


PIPELINE_SOURCES = [english(n) for n in range(3, 1000, 16)]  # 63 sentences


@pytest.mark.parametrize("beam", [1, 4])
def test_the_pipeline_gives_generates_strings(case, beam):
    """mtkit.pipeline("translation", model=FOLDER), the drop-in for transformers 4's pipeline, imports the
    Marian folder on load and gives the strings MarianMTModel.generate gives with the same settings."""
    import mtkit

    folder, _ = case
    model, tok = hf(folder)
    batch = tok(PIPELINE_SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=beam, max_length=MAX_LENGTH)
    theirs = tok.batch_decode(out, skip_special_tokens=True)
    pipe = mtkit.pipeline("translation", model=folder, device=-1, threads=1)
    answers = pipe(PIPELINE_SOURCES, num_beams=beam, max_length=MAX_LENGTH, batch_size=16)
    ours = [a["translation_text"] for a in answers]
    assert len(ours) == len(PIPELINE_SOURCES) >= 60
    assert ours == theirs
    assert len(set(ours)) >= 10  # varied outputs, not one string for all
