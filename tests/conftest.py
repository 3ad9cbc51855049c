"""Shared fixtures: tiny corpora built on the spot, and the location of the shared Multi30k data."""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

# OpenMP threads that spin while waiting make a shared 2-core machine crawl; set before torch loads.
# One thread, fixed: the tiny models gain nothing from more, and a count that followed the machine's
# load (mtkit.engines.threads) would make a test's float sums depend on what else runs.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# TorchInductor's cache (TMPDIR/torchinductor_USER by default, never removed) in a folder of the test
# session's, removed when it ends: set here, before any test module copies os.environ for its subprocesses.
_CACHES = tempfile.mkdtemp(prefix="mtkit-test-caches-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHES, "torchinductor")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# One thread from the start (what collection and session fixtures see); the autouse fixture one_torch_thread
# below holds each test to it. Test modules set no threads of their own.
torch.set_num_threads(1)

MULTI30K = Path(os.environ.get("MTKIT_MULTI30K",
                               Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"))
# The Multi30k en-de model trained by its recipe: MTKIT_MODELS/multi30k-en-de, else beside the corpus
# (shared/data/multi30k -> shared/models/multi30k-en-de).
MODELS = Path(os.environ.get("MTKIT_MODELS", MULTI30K.parent.parent / "models"))


# onnxruntime (1.31 and 1.32 at least) starts Microsoft's 1DS telemetry SDK when it is imported, which writes a
# session file TMPDIR/.ses (a timestamp and an id, 51 bytes) and never removes it; disable_telemetry_events()
# does not stop it. The tests (and the mtkit processes they start) import it: the file is removed at the end of
# the session unless it was there before.
_ORT_SESSION_FILE = Path(tempfile.gettempdir()) / ".ses"
_ORT_SESSION_FILE_BEFORE = _ORT_SESSION_FILE.exists()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test starts on one torch thread (the tiny models gain nothing from more, and they suffer badly
    when the cores are shared), and whatever a test set (a test of threads, an engine that chooses its
    count) is put back to one after it."""
    torch.set_num_threads(1)
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_CACHES, ignore_errors=True)
    if not _ORT_SESSION_FILE_BEFORE:
        _ORT_SESSION_FILE.unlink(missing_ok=True)


WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()


def write_reverse_corpus(folder: Path, n_train: int = 3000, n_valid: int = 60, seed: int = 0) -> dict:
    """Word sequences -> the same words reversed; train/valid/test text files."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
        src, tgt = [], []
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 7))]
            src.append(" ".join(words))
            tgt.append(" ".join(reversed(words)))
        (folder / f"{split}.src").write_text("\n".join(src) + "\n")
        (folder / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
        files[split] = (folder / f"{split}.src", folder / f"{split}.tgt")
    return files


def reverse_data_config(files: dict, vocab_size: int = 100) -> dict:
    return {
        "src_lang": "en",
        "tgt_lang": "de",
        "train": {"kind": "files", "src": str(files["train"][0]), "tgt": str(files["train"][1])},
        "valid": {"kind": "files", "src": str(files["valid"][0]), "tgt": str(files["valid"][1])},
        "test": {"kind": "files", "src": str(files["test"][0]), "tgt": str(files["test"][1])},
        "spm": {"vocab_size": vocab_size, "model_type": "bpe"},
        "workers": 1,
    }


class ListStore:
    """An in-memory parallel store of (source ids, target ids) pairs: what batching reads of a split."""

    def __init__(self, pairs) -> None:
        self.pairs = [(np.asarray(s), np.asarray(t)) for s, t in pairs]
        self.src_lengths = np.array([len(s) for s, _ in self.pairs])
        self.tgt_lengths = np.array([len(t) for _, t in self.pairs])

    def __len__(self) -> int:
        return len(self.pairs)

    def src(self, i: int):
        return self.pairs[i][0]

    def tgt(self, i: int):
        return self.pairs[i][1]


def write_tiny_checkpoint(path: Path, decode: dict | None = None) -> Path:
    """A tiny untrained mtkit checkpoint (one layer a side) with a real SentencePiece model of number
    words: its outputs do not matter, only that every command loads and runs it. ``decode``: its recipe's
    decode section (the defaults without, but the integrity guard off: an untrained model's outputs loop, and
    searching each again would test the guard everywhere; tests/unit/test_pipeline.py tests it)."""
    from mtkit.checkpoints.io import model_payload, save_checkpoint, vocab_entry
    from mtkit.config import Config, DecodeConfig, ModelConfig, SpmConfig, config_to_dict
    from mtkit.data.synthetic import english, german
    from mtkit.data.vocab import Vocab, train_model
    from mtkit.model import Transformer

    sentences = [english(n) for n in range(0, 1000, 7)] + [german(n) for n in range(0, 1000, 7)]
    vocab = Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=80)))
    cfg = ModelConfig(d_model=16, h=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)
    torch.manual_seed(0)
    model = Transformer(cfg, vocab.src_size, vocab.tgt_size)
    config = config_to_dict(Config(model=cfg, decode=DecodeConfig(**{"guard": False, **(decode or {})})))
    return save_checkpoint(model_payload(config, model.state_dict(), vocab_entry(vocab),
                                         vocab.src_size, vocab.tgt_size, step=1), path)


# ------------------------------------------------------------------ tiny untrained models (built in process)

TINY_SHAPE = {"d_model": 32, "h": 4, "d_ff": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0,
              "max_positions": 64}
_NUMBER_VOCABS: dict[int, Any] = {}


def number_vocab(vocab_size: int = 120):
    """A real SentencePiece vocabulary of English and German number words (every third number below 1000):
    trained once per size in a session (vocabularies are read, never changed)."""
    if vocab_size not in _NUMBER_VOCABS:
        from mtkit.config import SpmConfig
        from mtkit.data.synthetic import english, german
        from mtkit.data.vocab import Vocab, train_model

        sentences = [english(n) for n in range(0, 1000, 3)] + [german(n) for n in range(0, 1000, 3)]
        _NUMBER_VOCABS[vocab_size] = Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=vocab_size)))
    return _NUMBER_VOCABS[vocab_size]


def tiny_transformer(src_vocab: int = 50, tgt_vocab: int | None = None, seed: int = 0, sharpen: float | None = None,
                     **shape):
    """An untrained Transformer of TINY_SHAPE (``shape`` overrides its fields), seeded, in training mode;
    ``sharpen`` multiplies the output projection: peakier, less repetitive outputs than the default init."""
    from mtkit.config import ModelConfig
    from mtkit.model import Transformer

    torch.manual_seed(seed)
    tgt_vocab = src_vocab if tgt_vocab is None else tgt_vocab
    model = Transformer(ModelConfig(**{**TINY_SHAPE, **shape}), src_vocab, tgt_vocab)
    if sharpen is not None:
        with torch.no_grad():
            model.output_projection.weight.mul_(sharpen)
    return model


def tiny_loaded(vocab=None, sharpen: float | None = 3.0, **shape):
    """What the checkpoint loader gives the engines (model, vocab, config, path) for an untrained tiny model
    in eval mode on ``vocab`` (number_vocab() when None)."""
    from types import SimpleNamespace

    from mtkit.config import Config, ModelConfig

    vocab = number_vocab() if vocab is None else vocab
    model = tiny_transformer(vocab.src_size, vocab.tgt_size, sharpen=sharpen, **shape).eval()
    return SimpleNamespace(model=model, vocab=vocab, config=Config(model=ModelConfig(**{**TINY_SHAPE, **shape})),
                           path=Path("tiny.pt"))


@pytest.fixture(scope="module")
def loaded():
    """tiny_loaded() for a module: an untrained sharpened model on the number-word vocabulary."""
    return tiny_loaded()


def fast_first(cases, keep: int = 1) -> list:
    """``cases`` for pytest.mark.parametrize with all but the first ``keep`` marked slow: for a test whose
    every case starts mtkit processes, the fast tier runs a few representatives and the slow tier all. A
    tuple is the values of several argument names."""
    def slow(case):
        if isinstance(case, type(pytest.param(None))):
            return pytest.param(*case.values, marks=[*case.marks, pytest.mark.slow], id=case.id)
        return pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)

    cases = list(cases)
    return cases[:keep] + [slow(case) for case in cases[keep:]]


# ------------------------------------------------------------------ shared checks and hostile files

def one_error(result) -> str:
    """The one ``error:`` line a failed mtkit process (a subprocess.CompletedProcess) printed last, exit
    code 1 and no traceback."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert len(errors) == 1 and result.stderr.rstrip().splitlines()[-1] == errors[0], result.stderr
    return errors[0]


def zip_bomb(checkpoint: Path, out: Path, megabytes: int = 200, keep_pickle: bool = False) -> Path:
    """``checkpoint``'s zip (a torch.save file) copied to ``out`` with its data.pkl deflated from
    ``megabytes`` MB of zeros (after the original pickle when ``keep_pickle``) into a file of KBs.
    Streamed: never the inflated size in memory."""
    import zipfile

    with zipfile.ZipFile(checkpoint) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("/data.pkl"):
                dst.writestr(info.filename, src.read(info))
                continue
            target = zipfile.ZipInfo(info.filename)
            target.compress_type = zipfile.ZIP_DEFLATED
            with dst.open(target, "w") as deflated:
                if keep_pickle:
                    deflated.write(src.read(info))
                chunk = bytes(1 << 20)
                for _ in range(megabytes):
                    deflated.write(chunk)
    return out


TINY_MODEL = {"d_model": 64, "h": 4, "d_ff": 128, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0,
              "max_positions": 128}


@pytest.fixture(scope="session")
def reverse_data(tmp_path_factory) -> tuple[Path, dict]:
    """A prepared reverse-task data directory and its data config (real SentencePiece, real store)."""
    from mtkit.commands.prepare import prepare
    from mtkit.config import config_from_dict

    root = tmp_path_factory.mktemp("reverse")
    files = write_reverse_corpus(root / "text")
    data = reverse_data_config(files)
    prepare(config_from_dict({"data": data}), root / "prepared", progress=False)
    return root / "prepared", data


@pytest.fixture(scope="session")
def reverse_run(reverse_data, tmp_path_factory) -> Path:
    """A tiny model trained briefly on the reverse task (outputs end, and vary); its decode: beam 2.
    A run directory that translate, score and other CLI tests share (train it once per session)."""
    from mtkit.config import config_from_dict
    from mtkit.training.trainer import train

    data_dir, data = reverse_data
    config = config_from_dict({
        "data": data, "model": TINY_MODEL, "decode": {"beam": 2},
        "train": {"max_tokens": 600, "lr_schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 40, "label_smoothing": 0.0,
                  "log_every": 50, "valid_every": 0, "save_every": 0, "max_steps": 150, "seed": 3},
    })
    run_dir = tmp_path_factory.mktemp("reverse-run") / "run"
    train(config, data_dir, run_dir, progress=False)
    return run_dir


@pytest.fixture(scope="session")
def comet(tmp_path_factory) -> Path:
    """A tiny COMET estimator (tests/tiny_comet.py: a random XLM-R, a real tokenizer, saved as unbabel-comet's
    releases are), built once a session: tests copy it before they change it."""
    from tiny_comet import write_tiny_comet

    return write_tiny_comet(tmp_path_factory.mktemp("comet") / "tiny-comet-da", "regression_metric")


@pytest.fixture
def logged():
    """The library's messages on stderr during the test, as the CLI has them (:func:`mtkit.logs.to_stderr`);
    the ``mtkit`` logger as it was afterwards (the library itself installs no handler)."""
    from mtkit.logs import to_stderr

    logger = logging.getLogger("mtkit")
    handlers, level = list(logger.handlers), logger.level
    to_stderr()
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


@pytest.fixture
def multi30k() -> Path:
    if not (MULTI30K / "train.en").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set MTKIT_MULTI30K to its folder)")
    return MULTI30K


def random_search_model(vocab: int = 40):
    """A small random Transformer with sharpened logits (less repetitive, more varied outputs than the
    default init), for search tests."""
    return tiny_transformer(vocab, sharpen=3.0).eval()


def random_sources(vocab: int = 40, lengths: tuple[int, ...] = (7, 3, 9, 5, 1, 6)) -> torch.Tensor:
    """Random source rows of the given lengths, each ending in EOS, padded with PAD."""
    from mtkit.config import EOS_ID, PAD_ID

    g = torch.Generator().manual_seed(1)
    batch = torch.full((len(lengths), max(lengths) + 1), PAD_ID)
    for i, n in enumerate(lengths):
        batch[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        batch[i, n] = EOS_ID
    return batch


def incremental_logprob(model, src_ids: list[int], tgt_ids: list[int]) -> float:
    """log P(tgt + EOS | src) the way search computes it, step by step: encode, init_cache, then one
    decode_step per token (an independent check of teacher-forced scoring)."""
    from mtkit.config import BOS_ID, EOS_ID

    with torch.inference_mode():
        memory, src_mask = model.encode(torch.tensor([src_ids + [EOS_ID]]))
        cache = model.init_cache(memory, src_mask)
        token, total = torch.tensor([BOS_ID]), 0.0
        for y in tgt_ids + [EOS_ID]:
            logits, cache = model.decode_step(token, cache)
            total += torch.log_softmax(logits.float(), dim=-1)[0, y].item()
            token = torch.tensor([y])
    return total


def http_exchange(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                  timeout: float = 120.0) -> tuple[int, Any, bytes] | None:
    """One HTTP/1.1 request to 127.0.0.1:``port`` -> (status, headers, body), or None when the server
    closed the connection without an answer.

    A server may answer before it has read the whole body (a 413 or a 400 for a body it has seen
    enough of) and close: that is right, and a client that only reads once it has sent everything
    gets a broken pipe instead of the answer. This one sends the body in pieces and reads whatever
    has arrived between them, so an early answer is taken; a connection closed with no answer at all
    (the kernel may drop an answer that a reset overtakes) is None, for the caller to judge.
    """
    import http.client
    import io
    import selectors
    import socket

    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None:
        head.append(f"Content-Length: {len(body)}")
    pending = memoryview("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + (body or b""))
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            closed = False
            deadline = time.monotonic() + timeout  # a hang guard, not a timing assertion
            while not closed:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer to {method} {path} within {timeout} s")
                for _, events in selector.select(timeout=1.0):
                    if events & selectors.EVENT_READ:
                        try:
                            chunk = sock.recv(1 << 16)
                        except (ConnectionResetError, BrokenPipeError):
                            chunk = b""
                        if chunk:
                            received += chunk
                        else:
                            closed = True
                    if events & selectors.EVENT_WRITE and pending and not closed:
                        try:
                            sent = sock.send(pending[: 1 << 16])
                            pending = pending[sent:]
                        except (ConnectionResetError, BrokenPipeError):
                            pending = memoryview(b"")  # the server has stopped reading: take what it says
                        if not pending:
                            selector.modify(sock, selectors.EVENT_READ)
    if not received:
        return None

    class _Received:
        def makefile(self, *args, **kwargs):
            return io.BytesIO(bytes(received))

    response = http.client.HTTPResponse(_Received(), method=method)  # type: ignore[arg-type]
    response.begin()
    try:
        content = response.read()
    except http.client.IncompleteRead as e:  # cut short by a reset: what came is what there is
        content = e.partial
    return response.status, response.headers, content
