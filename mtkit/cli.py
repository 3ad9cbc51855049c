"""The ``mtkit`` command line: parse options, call a command, map errors to exit codes.

Exit codes: 0 success; 1 a user error, printed as one ``error: …`` line on stderr
(``--debug`` or ``MTKIT_DEBUG=1`` shows the traceback); 2 a usage error.
Heavy libraries (torch, datasets, sacrebleu) are imported inside the commands, so
that ``mtkit --help`` answers at once.

Its length is the options: one Typer function per command, each option typed with its help on one
line, and nothing else (the glue is in :mod:`mtkit.commands`).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
import typing
from pathlib import Path

import typer
from typer.core import TyperGroup

from mtkit.errors import MtkitError
from mtkit.version import __version__


class _Stop(Exception):
    """How a command ended when Click would otherwise swallow it: ``code`` and an optional message."""

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Group(TyperGroup):
    """Click turns Ctrl-C into a silent exit 130 and a broken pipe into exit 1 before ``main``
    sees them: catch both here, around the command itself."""

    def invoke(self, ctx):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Stop(130, "interrupted") from None
        except BrokenPipeError:  # e.g. `mtkit translate ... | head -1`: the reader has all it wants
            raise _Stop(0) from None


app = typer.Typer(
    name="mtkit",
    cls=_Group,
    help="Train, run and evaluate Transformer translation models (Vaswani et al., 2017).",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
export_app = typer.Typer(help="Export a checkpoint to another inference engine.", no_args_is_help=True)
app.add_typer(export_app, name="export")
import_app = typer.Typer(help="Import a model trained elsewhere as an mtkit run directory.", no_args_is_help=True)
app.add_typer(import_app, name="import")

SetOption = typer.Option(
    None, "--set", "-s", metavar="KEY=VALUE", help="Override one recipe key, e.g. --set train.max_steps=100 (repeatable)."
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mtkit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors (or set MTKIT_DEBUG=1)."),
) -> None:
    if debug:
        os.environ["MTKIT_DEBUG"] = "1"
    from mtkit.engines.threads import mark_start
    from mtkit.logs import to_stderr

    mark_start()  # the load reading the first thread count reads from (mtkit.engines.threads.since_start)
    to_stderr()  # what the library says (``logging.getLogger("mtkit…")``) goes to stderr, a line each


def _load(recipe: Path | None, overrides: list[str] | None, flags=None, defaults=None):
    from mtkit.config import load_config

    return load_config(recipe, overrides or [], flags, defaults)


# ------------------------------------------------------------------ prepare


@app.command()
def prepare(
    recipe: Path | None = typer.Argument(None, help="YAML recipe (its data section is used)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory for the prepared data."),
    src: Path | None = typer.Option(None, "--src", help="Training source file (one sentence per line, .gz ok)."),
    tgt: Path | None = typer.Option(None, "--tgt", help="Training target file, line-aligned with --src."),
    tsv: Path | None = typer.Option(None, "--tsv", help="Training pairs as 'source<TAB>target' lines."),
    hf: str | None = typer.Option(None, "--hf", help="Training data from a Hugging Face dataset (hub name or local folder)."),
    hf_config: str | None = typer.Option(None, "--hf-config", help="The dataset's configuration, e.g. de-en."),
    valid_src: Path | None = typer.Option(None, "--valid-src", help="Validation source file."),
    valid_tgt: Path | None = typer.Option(None, "--valid-tgt", help="Validation target file."),
    test_src: Path | None = typer.Option(None, "--test-src", help="Test source file."),
    test_tgt: Path | None = typer.Option(None, "--test-tgt", help="Test target file."),
    src_lang: str | None = typer.Option(None, "--src-lang", help="Source language code (data.src_lang)."),
    tgt_lang: str | None = typer.Option(None, "--tgt-lang", help="Target language code (data.tgt_lang)."),
    demo: bool = typer.Option(False, "--demo", help="Use the built-in synthetic corpus (number words, en → de)."),
    vocab_from: Path | None = typer.Option(None, "--vocab-from", help="Encode with this checkpoint's (or run "
                                              "directory's) SentencePiece model, to fine-tune it (data.spm.vocab_from)."),
    alignments: str | None = typer.Option(None, "--alignments", help="Store word alignments of the training pairs for guided alignment (train.guided_alignment): eflomal computes them (extra [align]), or a Pharaoh file, a line per pair (data.alignments)."),
    filter_: list[str] | None = typer.Option(None, "--filter", help="Turn on a cleaning filter with its default settings (repeatable): nonprinting, alpha, repeats, copy, numbers, urls, langid (extra [clean]); data.clean.filters."),
    report: Path | None = typer.Option(None, "--report", help="Write the cleaning report (per rule and filter: pairs dropped, examples) to this file: Markdown for .md, else JSON."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when the output is complete and up to date "
                               "(it replaces only an earlier mtkit output, never other files)."),
    set_: list[str] | None = SetOption,
) -> None:
    """Clean parallel text, train SentencePiece and write a memory-mapped training set.

    Reads: a recipe's data section and/or the files given as options (plain text, TSV,
    gzip, or a Hugging Face dataset). Writes to OUT: manifest.json, spm.model,
    train/valid/test stores, and the cleaned valid/test text.

    \b
    Example:
      mtkit prepare --src train.en --tgt train.de --valid-src val.en --valid-tgt val.de -o data/en-de
      mtkit prepare --src new.en --tgt new.de --vocab-from runs/en-de -o data/new    # to fine-tune runs/en-de
      mtkit prepare --src train.en --tgt train.de --alignments eflomal -o data/aligned  # for guided alignment
      mtkit prepare recipe.yaml --filter langid --filter copy --report clean.md -o data/en-de
    """
    from mtkit.commands.prepare import DataFlags, prepare_from_flags

    prepare_from_flags(recipe, out, set_, DataFlags(
        src=src, tgt=tgt, tsv=tsv, hf=hf, hf_config=hf_config, valid_src=valid_src, valid_tgt=valid_tgt,
        test_src=test_src, test_tgt=test_tgt, src_lang=src_lang, tgt_lang=tgt_lang, demo=demo, vocab_from=vocab_from,
        alignments=alignments, filters=tuple(filter_ or ()),
    ), force=force, report=report)


# -------------------------------------------------------------------- train


@app.command()
def train(
    recipe: Path | None = typer.Argument(None, help="YAML recipe (model, train and decode sections)."),
    data: Path = typer.Option(..., "--data", "-d", help="Prepared data directory (from mtkit prepare)."),
    run: Path = typer.Option(..., "--run-dir", "-r", help="Run directory for config, checkpoints, metrics and curves."),
    resume: bool | None = typer.Option(
        None, "--resume/--no-resume", help="Continue from the run's last checkpoint (default: when there is one)."
    ),
    init_from: Path | None = typer.Option(
        None, "--init-from", help="Start a new run from this checkpoint's (or run directory's) weights: fine-tuning "
        "(train.init_from; prepare the data with --vocab-from it)."
    ),
    nnodes: int | None = typer.Option(None, "--nnodes", help="Machines that train together, one such command on each (default: train.nodes); they meet at --rdzv-endpoint."),
    node_rank: int | None = typer.Option(None, "--node-rank", help="This machine's number among --nnodes, from 0; node 0 holds rank 0, which writes RUN (default 0)."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0, where the machines meet: the same on every machine; node 0 opens the port."),
    set_: list[str] | None = SetOption,
) -> None:
    """Train a Transformer on prepared data; several processes or GPUs: train.processes or torchrun;
    several machines: --nnodes, --node-rank and --rdzv-endpoint (docs/training.md, "Several machines").

    Reads: the recipe and DATA. Writes to RUN: config.yaml, spm.model, checkpoints/
    (step_N.pt, last.pt, best.pt, averaged.pt), metrics.jsonl and curves.png.

    \b
    Example:
      mtkit train recipes/multi30k-en-de.yaml -d data/en-de -r runs/en-de --set train.max_steps=2000
      mtkit train recipe.yaml -d DATA -r RUN --set train.processes=2    # 2 local DDP ranks via torchrun
      torchrun --nproc_per_node 4 -m mtkit train recipe.yaml -d DATA -r RUN
      mtkit train recipe.yaml -d DATA -r RUN-ft --init-from RUN    # fine-tune RUN's model on DATA
      mtkit train recipe.yaml -d DATA -r RUN --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500   # on node0
      mtkit train recipe.yaml -d DATA -r RUN --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29500   # on node1
    """
    from mtkit.commands.processes import check_nodes
    from mtkit.commands.train import train as run_train

    flags = {"train.init_from": ("--init-from", str(init_from))} if init_from is not None else None
    config = _load(recipe, set_, flags)
    nodes = check_nodes(config, nnodes, node_rank, rdzv_endpoint)
    run_train(config, data, run, resume=resume, nodes=nodes)


@app.command()
def average(
    run: Path = typer.Argument(..., help="Run directory."),
    last: int = typer.Option(5, "--last", "-n", help="How many of the last step checkpoints to average (paper: 5 base, 20 big)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Output file (default RUN/checkpoints/averaged.pt)."),
) -> None:
    """Average the last N checkpoints of a run into one that translate and evaluate accept.

    Reads: RUN/checkpoints/step_*.pt. Writes: RUN/checkpoints/averaged.pt (or --output).

    \b
    Example:
      mtkit average runs/en-de --last 5
    """
    from mtkit.training.average import average_run

    path = average_run(run, last, output)
    typer.echo(str(path), err=True)


@app.command()
def curves(run: Path = typer.Argument(..., help="Run directory.")) -> None:
    """Redraw a run's training curves (loss and validation BLEU against step).

    Reads: RUN/metrics.jsonl. Writes: RUN/curves.png.

    \b
    Example:
      mtkit curves runs/en-de
    """
    from mtkit.training.curves import draw_curves

    typer.echo(str(draw_curves(run / "metrics.jsonl", run / "curves.png")), err=True)


# ---------------------------------------------------------------- translate

CONSTRAINTS_HELP = ("JSON lines, one object per input line: {\"include\": [phrases the translation must hold], "
                    "\"exclude\": [phrases it must not]}, {} for none (torch: both; ctranslate2: exclude only).")
ENGINE_HELP = ("torch | ctranslate2 (an exported model, or a checkpoint or run directory, exported on first use and "
               "kept beside it) | onnx (a folder mtkit export onnx wrote).")
SHORTLIST_HELP = ("A vocabulary shortlist per sentence (RUN/shortlist.txt, built by mtkit shortlist RUN): the output "
                  "layer computed for the target pieces the sentence's source pieces translate to, the most frequent "
                  "ones and its own pieces only; faster, nearly always the same output (torch; ctranslate2: its "
                  "use_vmap, per batch).")
GLOSSARY_HELP = ("TSV 'source term<TAB>target term': where a line holds the source term (any case, whole words), "
                 "the translation holds the target term (torch engine only).")


@app.command()
def translate(
    model: list[Path] = typer.Option(..., "--model", "-m", help="Checkpoint or run directory (repeat for an ensemble; "
                                     "with --engine ctranslate2, an exported model directory too; with --engine "
                                     "onnx, a folder mtkit export onnx wrote)."),
    inputs: list[str] | None = typer.Argument(None, help="Input files; '-' or none reads stdin."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
    beam: int | None = typer.Option(None, "--beam", "-b", help="Beam size (paper: 4); 1 = greedy."),
    greedy: bool = typer.Option(False, "--greedy", help="Greedy decoding (same as --beam 1)."),
    alpha: float | None = typer.Option(None, "--alpha", help="Length penalty α (paper: GNMT's, 0.6)."),
    length_penalty: str | None = typer.Option(None, "--length-penalty", help="gnmt: ((5+L)/6)^α (paper); power: L^α (fairseq --lenpen, Marian --normalize)."),
    nbest: int | None = typer.Option(None, "--nbest", help="Print the K best hypotheses per input (K <= --beam, as fairseq; implies --format nbest)."),
    max_len_a: float | None = typer.Option(None, "--max-len-a", help="Maximum output length = a·source + b."),
    max_len_b: int | None = typer.Option(None, "--max-len-b", help="Maximum output length = a·source + b (paper: +50)."),
    min_len: int | None = typer.Option(None, "--min-len", help="EOS banned before this many output tokens (0: off; fairseq's --min-len)."),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", help="Source tokens per batch."),
    no_repeat_ngram_size: int | None = typer.Option(None, "--no-repeat-ngram-size", help="Forbid repeating n-grams of this size."),
    sampling: bool = typer.Option(False, "--sampling", help="Sample instead of searching (e.g. for back-translation)."),
    temperature: float | None = typer.Option(None, "--temperature", help="With --sampling: divide the logits by this (> 0; default 1, below 1 is more conservative)."),
    top_k: int | None = typer.Option(None, "--top-k", help="With --sampling: sample among the K most probable tokens only (0 = all)."),
    top_p: float | None = typer.Option(None, "--top-p", help="With --sampling: sample from the smallest set of tokens holding this probability (in (0, 1]; nucleus sampling)."),
    epsilon: float | None = typer.Option(None, "--epsilon", help="With --sampling: drop tokens below this probability (epsilon sampling; 0.02 for MBR's candidates, Freitag et al. 2023; torch engine)."),
    mbr: str | None = typer.Option(None, "--mbr", help="Minimum-Bayes-risk decoding: among --mbr-candidates hypotheses (an n-best list, or samples with --sampling), the one of the highest expected utility: chrf | bleu | comet | off."),
    mbr_candidates: int | None = typer.Option(None, "--mbr-candidates", help="With --mbr: hypotheses to choose from (default 8; the beam is widened to as many)."),
    mbr_comet_model: str | None = typer.Option(None, "--mbr-comet-model", help="With --mbr comet: a reference-based COMET model, hub name or folder (default Unbabel/wmt22-comet-da; needs mtkit[comet])."),
    output_format: str | None = typer.Option(None, "--format", help="text | tokens | scores | nbest (K lines per input: INDEX ||| text ||| SCORE) | json (one object per input: text, score, logprob, confidence, tokens, nbest, unmet, sentences) | html | xml (each line a fragment: inline tags put back around the aligned words) | docx | pptx | odt | odp | epub | srt | vtt | md | txt (the input is one document of that format: translated whole, its structure and formatting kept; taken from FILE's extension without --format, .html included); default text, nbest with --nbest K > 1."),
    qe: bool = typer.Option(False, "--qe", help="Each translation's quality estimate, without a reference: a tab-separated column of --format text, a key qe of json. The model's confidence (mean log-probability per token), or COMET-QE's score with --qe-model."),
    qe_model: str | None = typer.Option(None, "--qe-model", help="A reference-free COMET model (hub name or folder, e.g. Unbabel/wmt22-cometkiwi-da) for --qe (implies it; needs mtkit[comet])."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 | bf16 | fp16 (fp16 on CUDA only)."),
    engine: str = typer.Option("torch", "--engine", help=ENGINE_HELP),
    quantization: str | None = typer.Option(None, "--quantization", help="With --engine ctranslate2 on a checkpoint or run directory: its export's weights (int8, int8_float32, int16, float16, ...; default float32)."),
    buffer_size: int | None = typer.Option(None, "--buffer-size", help="Lines read per chunk (default 1000, fewer when a pipe has no more ready; 1 = flush every line)."),
    alignments: bool = typer.Option(False, "--alignments", help="Word alignments of each output, in the Pharaoh format (0-0 1-2: source word - target word, 0-based, whitespace words): 'text ||| 0-0 1-2' (text), a last '||| ...' field (nbest), a key alignment (json). Hard: each target word to its most attended source word."),
    alignment_threshold: float | None = typer.Option(None, "--alignment-threshold", help="Soft alignments (implies --alignments): every word pair of at least this attention weight, in (0, 1]."),
    alignment_layer: int | None = typer.Option(None, "--alignment-layer", help="Align with this decoder layer's mean cross-attention (0-based, negative from the end; default: the guided-alignment head of a model trained with one, else the penultimate layer)."),
    split: str | None = typer.Option(None, "--split", help="sentences: a line's sentences translated one by one and joined with the line's own whitespace (default); none: each line one sentence."),
    guard: bool | None = typer.Option(None, "--guard/--no-guard", help="The integrity guard (default on): a sentence whose translation lacks a number, URL, e-mail address or placeholder of its source is searched again with it forced (torch engine; others report it); a repetition loop, again without repeating 3-grams."),
    shortlist: bool | None = typer.Option(None, "--shortlist/--no-shortlist", help=SHORTLIST_HELP),
    protect: str | None = typer.Option(None, "--protect", help="A regular expression of placeholders to carry through untranslated (e.g. '\\{\\w+\\}|%s'): taken out of each line, put back beside the words aligned to their neighbours, spaced as in the source (the pattern may take 1 s a line; not with --alignments)."),
    alignments_out: Path | None = typer.Option(None, "--alignments-out", help="Write the best translation's alignment here, a line per input line (implies --alignments; the translations then unchanged)."),
    attention_png: Path | None = typer.Option(None, "--attention-png", help="Write the first sentence's cross-attention heatmap here."),
    attention_layer: int | None = typer.Option(None, "--attention-layer", help="Heatmap of one decoder layer (default: mean of all)."),
    threads: int = typer.Option(0, "--threads", help="CPU threads (0: one per CPU other work leaves free, or OMP_NUM_THREADS)."),
    constraints: Path | None = typer.Option(None, "--constraints", help=CONSTRAINTS_HELP),
    glossary: Path | None = typer.Option(None, "--glossary", help=GLOSSARY_HELP),
    tgt_lang: str | None = typer.Option(None, "--tgt-lang", help="The language to translate into, for a "
                                           "multilingual model (required when it has several targets)."),
) -> None:
    """Translate text, one output line per input line, always; or one document, into the same format.

    Reads: files or stdin, one sentence per line (from a pipe, what has arrived is translated
    whenever no more is ready). Writes: translations to stdout (or --output); the checkpoint
    loaded, warnings and progress to stderr. A FILE.docx, .pptx, .odt, .odp, .epub, .srt, .vtt,
    .md or .html (or --format with one of them) is one document: its structure, timings, code
    and formatting come back as they were, its text translated (docs/documents.md).

    \b
    Example:
      echo "two hundred five" | mtkit translate -m work/demo/run
      mtkit translate -m work/demo/run --beam 5 --nbest 3 test.en    # 3 lines per input
      mtkit translate -m work/demo/run --glossary terms.tsv test.en  # forces its terms in (torch engine)
      mtkit translate -m work/demo/run talk.srt -o talk.de.srt       # a document, in its own format
    """
    from mtkit.commands.translate import TranslateOptions
    from mtkit.commands.translate import translate as run_translate
    from mtkit.config import DecodeOptions

    run_translate(list(model), list(inputs or ["-"]), TranslateOptions(
        output=output, output_format=output_format, device=device, precision=precision, engine=engine,
        buffer_size=buffer_size, attention_png=attention_png, attention_layer=attention_layer, threads=threads,
        decode=DecodeOptions(
            beam=1 if greedy else beam, alpha=alpha, length_penalty=length_penalty, nbest=nbest, max_len_a=max_len_a,
            max_len_b=max_len_b, min_len=min_len, batch_tokens=batch_tokens, no_repeat_ngram_size=no_repeat_ngram_size,
            sampling=True if sampling else None, temperature=temperature, top_k=top_k, top_p=top_p, epsilon=epsilon,
            mbr=mbr, mbr_candidates=mbr_candidates, mbr_comet_model=mbr_comet_model,
            alignments="soft" if alignment_threshold is not None else "hard" if alignments else None,
            alignment_threshold=alignment_threshold, alignment_layer=alignment_layer, split=split, guard=guard,
            shortlist=shortlist,
        ), constraints=constraints,
        glossary=glossary, tgt_lang=tgt_lang, quantization=quantization, qe=qe, qe_model=qe_model,
        alignments_out=alignments_out, protect=protect,
    ))


@app.command("shortlist")
def shortlist(
    run: Path = typer.Argument(..., help="Run directory (or a checkpoint in one): RUN/shortlist.txt is written."),
    source: Path | None = typer.Option(None, "--source", help="Count these source sentences (with --target) instead of the run's training corpus (data.train)."),
    target: Path | None = typer.Option(None, "--target", help="The target sentences, line-aligned with --source."),
    per_source: int | None = typer.Option(None, "--per-source", help="Candidates kept per source piece: the most likely given it (default: the run's shortlist.per_source, 64)."),
    frequent: int | None = typer.Option(None, "--frequent", help="The most frequent target pieces, candidates for every sentence (default: shortlist.frequent, 256)."),
    max_pairs: int | None = typer.Option(None, "--max-pairs", help="Count at most this many pairs, a seeded sample of a larger corpus (default: shortlist.max_pairs, 1,000,000)."),
) -> None:
    """Build a vocabulary shortlist for translate --shortlist: RUN/shortlist.txt.

    Reads: the run's training pairs (or --source/--target), encoded with its SentencePiece model.
    Writes: RUN/shortlist.txt, CTranslate2's vocabulary map (the CTranslate2 export ships it as
    vmap.txt); what it wrote on stderr. Per source piece, the target pieces that co-occur with it
    most, the frequent ones aside; a sentence may use those of its pieces, the frequent ones and
    its own pieces (docs/shortlist.md).

    \b
    Example:
      mtkit shortlist work/demo/run && mtkit translate -m work/demo/run --shortlist --beam 5 test.en
    """
    from mtkit.commands.shortlist import ShortlistOptions, build_shortlist

    build_shortlist(run, ShortlistOptions(source=source, target=target, per_source=per_source, frequent=frequent,
                                          max_pairs=max_pairs))


@export_app.command("ctranslate2")
def export_ctranslate2(
    checkpoint: Path = typer.Argument(..., help="Checkpoint or run directory."),
    out_dir: Path = typer.Argument(..., help="Output directory for the CTranslate2 model."),
    quantization: str | None = typer.Option(None, "--quantization", help="e.g. int8, int8_float32, float16."),
) -> None:
    """Write a CTranslate2 model (and the SentencePiece model) for fast inference.

    Needs the export extra: pip install 'mtkit[export]'.

    \b
    Example:
      mtkit export ctranslate2 runs/en-de ct2-en-de && mtkit translate --engine ctranslate2 -m ct2-en-de in.txt
    """
    from mtkit.commands.export import export_ctranslate2 as run_export

    run_export(checkpoint, out_dir, quantization)


@export_app.command("hf")
def export_hf(
    checkpoint: Path = typer.Argument(..., help="Checkpoint or run directory."),
    out_dir: Path = typer.Argument(..., help="Output folder for the Hugging Face model."),
    beam: int | None = typer.Option(None, "--beam", help="generation_config.json's num_beams (default: the recipe's)."),
    alpha: float | None = typer.Option(None, "--alpha", help="Its length_penalty: score / length^α (default: the recipe's α)."),
    length_penalty: str | None = typer.Option(None, "--length-penalty", help="power (Hugging Face's only); a recipe's gnmt with a beam is refused."),
) -> None:
    """Write a Hugging Face model folder: transformers' AutoModelForSeq2SeqLM and AutoTokenizer load it.

    Post-norm models become MarianMT, pre-norm ones Pegasus; the folder holds config.json,
    model.safetensors, generation_config.json (the recipe's decoding), the tokenizer and a model card.
    Needs transformers: pip install 'mtkit[hf]'.

    \b
    Example:
      mtkit export hf runs/en-de hf-en-de
    """
    from mtkit.commands.export import export_hf as run_export
    from mtkit.config import DecodeOptions

    run_export(checkpoint, out_dir, DecodeOptions(beam=beam, alpha=alpha, length_penalty=length_penalty))


@export_app.command("onnx")
def export_onnx(
    checkpoint: Path = typer.Argument(..., help="Checkpoint or run directory."),
    out_dir: Path = typer.Argument(..., help="Output folder for the ONNX graphs."),
) -> None:
    """Write ONNX graphs: the encoder, and one decoding step with its key/value cache in and out.

    Traced by torch.onnx from mtkit's own modules (no optimum); the folder also holds the SentencePiece
    model(s) and mtkit.json. Needs pip install 'mtkit[onnx]'.

    \b
    Example:
      mtkit export onnx runs/en-de onnx-en-de
    """
    from mtkit.commands.export import export_onnx as run_export

    run_export(checkpoint, out_dir)


@import_app.command("marian")
def import_marian(
    source: str = typer.Argument(..., help="A folder saved by MarianMTModel/MarianTokenizer.save_pretrained "
                                           "(or written by mtkit export hf), or a hub name such as "
                                           "Helsinki-NLP/opus-mt-en-de."),
    out_dir: Path = typer.Option(..., "--output", "-o", help="The run directory to write (new or empty)."),
) -> None:
    """Import a Marian / OPUS-MT model (Hugging Face layout) as a run directory.

    \b
    Example:
      mtkit import marian Helsinki-NLP/opus-mt-en-de -o runs/opus-en-de
      echo "Hello world." | mtkit translate -m runs/opus-en-de
    """
    from mtkit.commands.import_model import import_marian as run_import

    run_import(source, out_dir)


@import_app.command("nllb")
def import_nllb(
    source: str = typer.Argument(..., help="A folder saved by M2M100ForConditionalGeneration and NllbTokenizer "
                                           "save_pretrained (with sentencepiece.bpe.model), or a hub name such "
                                           "as facebook/nllb-200-distilled-600M."),
    out_dir: Path = typer.Option(..., "--output", "-o", help="The run directory to write (new or empty)."),
    src_lang: str | None = typer.Option(None, "--source", "-s", help="The source language's code, e.g. "
                                        "eng_Latn (default: tokenizer_config.json's src_lang)."),
    targets: list[str] | None = typer.Option(None, "--target", "-t", help="A language code to translate into, "
                                             "e.g. fra_Latn, or fr where the model has one French (repeat; default: every code of the model)."),
) -> None:
    """Import an NLLB-200 or M2M100 model (Hugging Face layout) as a multilingual run directory.

    \b
    Example:
      mtkit import nllb facebook/nllb-200-distilled-600M -o runs/nllb -s eng_Latn -t fra_Latn -t deu_Latn
      echo "Hello world." | mtkit translate -m runs/nllb --tgt-lang fra_Latn
    """
    from mtkit.commands.import_model import import_nllb as run_import

    run_import(source, out_dir, src_lang, tuple(targets or ()))


# ----------------------------------------------------------------- evaluate


@app.command()
def evaluate(
    hyp: list[Path] | None = typer.Option(None, "--hyp", help="Hypothesis file, '-' for stdin (repeat to compare systems by paired bootstrap)."),
    ref: list[Path] | None = typer.Option(None, "--ref", help="Raw reference file (repeat for several references)."),
    model: list[Path] | None = typer.Option(None, "--model", "-m", help="Translate --src (or the test set) with this checkpoint or run directory, then score (repeat for an ensemble; an exported model with --engine)."),
    src: Path | None = typer.Option(None, "--src", help="Source file to translate with --model."),
    testset: str | None = typer.Option(None, "--testset", "-t", help="A sacrebleu test set, e.g. wmt14/full (3,003 sentences, what papers use)."),
    langpair: str | None = typer.Option(None, "--langpair", "-l", help="Language pair of --testset, e.g. en-de."),
    hyp_out: Path | None = typer.Option(None, "--hyp-out", help="Also write --model's hypotheses here (by default they are scored in memory and not kept)."),
    metrics: str = typer.Option("bleu,chrf,ter", "--metrics", help="Comma-separated: bleu, chrf, ter, comet (COMET needs --src and mtkit[comet]), confidence (--model's mean token log-probability). Without --ref: confidence, or comet with a reference-free model such as CometKiwi (quality estimation)."),
    comet_model: str | None = typer.Option(None, "--comet-model", help="The COMET model: a hub name or a local folder (hparams.yaml, checkpoints/model.ckpt). Default: Unbabel/wmt22-comet-da."),
    chrf_plus: bool = typer.Option(False, "--chrf-plus", help="chrF++ (word bigrams too) instead of chrF."),
    lc_tok: bool = typer.Option(False, "--lc-tok", help="Also the literature's lowercased, Moses-tokenized BLEU (Multi30k, IWSLT)."),
    lowercase: bool = typer.Option(False, "--lowercase", help="Case-insensitive BLEU and chrF, as sacrebleu -lc --chrf-lowercase (on by itself for a model with data.spm.lowercase)."),
    compound_split: bool = typer.Option(False, "--compound-split", help="Also the WMT14 en-de paper's tokenized BLEU with compound splitting (legacy)."),
    lang: str | None = typer.Option(None, "--lang", help="Target language for tokenized BLEU (default: from file suffix)."),
    as_json: bool = typer.Option(False, "--json", help="JSON output (stable schema) instead of a table."),
    beam: int | None = typer.Option(None, "--beam", "-b", help="Beam size for --model."),
    alpha: float | None = typer.Option(None, "--alpha", help="Length penalty α for --model."),
    length_penalty: str | None = typer.Option(None, "--length-penalty", help="gnmt | power, for --model (see translate --help)."),
    mbr: str | None = typer.Option(None, "--mbr", help="With --model: minimum-Bayes-risk decoding, chrf | bleu | comet | off (see translate --help)."),
    mbr_candidates: int | None = typer.Option(None, "--mbr-candidates", help="With --mbr: hypotheses to choose from (default 8)."),
    mbr_comet_model: str | None = typer.Option(None, "--mbr-comet-model", help="With --mbr comet: the COMET model of its utility (default Unbabel/wmt22-comet-da)."),
    split: str | None = typer.Option(None, "--split", help="With --model: sentences: a line's sentences translated one by one and joined with the line's own whitespace (default); none: each line one sentence."),
    guard: bool | None = typer.Option(None, "--guard/--no-guard", help="With --model: the integrity guard (default on): a sentence whose translation lacks a number, URL, e-mail address or placeholder of its source is searched again with it forced (torch engine; others report it); a repetition loop, again without repeating 3-grams."),
    shortlist: bool | None = typer.Option(None, "--shortlist/--no-shortlist", help="With --model: " + SHORTLIST_HELP),
    device: str = typer.Option("auto", "--device", help="Where --model runs: auto | cpu | cuda | cuda:N."),
    engine: str = typer.Option("torch", "--engine", help="What runs --model: " + ENGINE_HELP),
    constraints: Path | None = typer.Option(None, "--constraints", help="With --model: " + CONSTRAINTS_HELP),
    glossary: Path | None = typer.Option(None, "--glossary", help="With --model: " + GLOSSARY_HELP),
    tgt_lang: str | None = typer.Option(None, "--tgt-lang", help="With --model, a multilingual one: the "
                                           "language to translate into (required when it has several targets)."),
) -> None:
    """Score translations with sacreBLEU (BLEU, chrF, TER) and COMET, printing each metric's signature.

    Reads: hypothesis and raw reference files, or translates a source file / named test
    set with --model first (scored in memory). Writes: the scores to stdout (table or
    --json); the hypotheses only to --hyp-out.

    \b
    Examples:
      mtkit evaluate --hyp hyp.de --ref test.de
      mtkit translate -m runs/en-de test.en | mtkit evaluate --hyp - --ref test.de
      mtkit evaluate -m runs/en-de --src test.en --ref test.de --lc-tok
      mtkit evaluate -m runs/en-de -m runs/en-de-2 --src test.en --ref test.de   # an ensemble
      mtkit evaluate --hyp hyp.de --src test.en --ref test.de --metrics bleu,comet
    """
    from mtkit.commands.evaluate import EvaluateOptions
    from mtkit.commands.evaluate import evaluate as run_evaluate
    from mtkit.config import DecodeOptions

    text = run_evaluate(EvaluateOptions(
        hyp=list(hyp or []), ref=list(ref or []), model=list(model) if model else None, src=src, testset=testset,
        langpair=langpair, hyp_out=hyp_out, metrics=[m.strip() for m in metrics.split(",") if m.strip()],
        chrf_plus=chrf_plus, lc_tok=lc_tok, compound_split=compound_split, lang=lang, as_json=as_json,
        decode=DecodeOptions(beam=beam, alpha=alpha, length_penalty=length_penalty, mbr=mbr,
                             mbr_candidates=mbr_candidates, mbr_comet_model=mbr_comet_model, split=split,
                             guard=guard, shortlist=shortlist), device=device, engine=engine,
        lowercase=lowercase, constraints=constraints, glossary=glossary, tgt_lang=tgt_lang, comet_model=comet_model,
    ))
    typer.echo(text)


# -------------------------------------------------------------------- score


@app.command()
def score(
    model: list[Path] = typer.Option(..., "--model", "-m", help="Checkpoint or run directory (repeat for an ensemble)."),
    src: str = typer.Option(..., "--src", help="Source file, one sentence per line (.gz ok); '-' for stdin."),
    tgt: str = typer.Option(..., "--tgt", help="Target file, line-aligned with --src; '-' for stdin (not both)."),
    output_format: str = typer.Option("text", "--format", help="text: LOGPROB<TAB>MEAN<TAB>TOKENS, 4 decimals | "
                                      'json: {"line": N, "logprob": .., "mean": .., "tokens": ..} per line.'),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", help="Padded tokens per batch (default: the checkpoint's decode.batch_tokens)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 | bf16 | fp16 (fp16 on CUDA only; log-softmax in fp32)."),
    tgt_lang: str | None = typer.Option(None, "--tgt-lang", help="The target language of a multilingual "
                                           "model (required when it has several targets)."),
) -> None:
    """Score given translations: log P(target | source) under the model (forced decoding).

    Reads: line-aligned source and target files. Writes: one line per pair to stdout, in
    input order, always: the sum of the natural-log probabilities of the target's pieces and
    EOS, their mean, and their number (an empty pair scores EOS alone; a pair longer than the
    model's positions: nan, with a warning). No label smoothing, no length penalty.

    \b
    Example:
      mtkit score -m runs/en-de --src test.en --tgt test.hyp
      mtkit translate -m runs/en-de test.en | mtkit score -m runs/en-de-2 --src test.en --tgt - --format json
    """
    from mtkit.commands.score import ScoreOptions
    from mtkit.commands.score import score as run_score

    run_score(list(model), src, tgt, ScoreOptions(output_format=output_format, batch_tokens=batch_tokens,
                                                  device=device, precision=precision, tgt_lang=tgt_lang))


# -------------------------------------------------------------------- detect


@app.command()
def detect(
    file: str = typer.Argument("-", help="Text file, one text per line (.gz ok); '-' or none for stdin."),
    languages: str | None = typer.Option(None, "--languages", "-l", help="The candidate languages, ISO 639-1 codes separated by commas (default: 23 common ones: ar cs da de el en es fi fr hi hu it ja ko nl pl pt ro ru sv tr uk zh)."),
) -> None:
    """Detect the language of each line (lingua; extra [serve] or [clean]).

    Reads: a text file. Writes: one line per input line to stdout, LANG<TAB>CONFIDENCE
    (ISO 639-1 code; 0-100, one decimal, as LibreTranslate's /detect), or an empty line for a
    line without letters. Each line is judged on its first 1,000 characters, among --languages
    only: a line in another language gets the closest of them. Invalid UTF-8 is an error naming
    the line, after the lines before it.

    \b
    Example:
      mtkit detect mixed.txt
      cat notes.txt | mtkit detect --languages en,de,fr | cut -f1 | sort | uniq -c
    """
    from mtkit.commands.detect import DetectOptions, parse_languages
    from mtkit.commands.detect import detect as run_detect

    run_detect(file, DetectOptions(languages=parse_languages(languages)))


# ---------------------------------------------------------------------- run


@app.command("run")
def run_recipe(
    recipe: Path = typer.Argument(..., help="YAML recipe."),
    work: Path | None = typer.Option(None, "--work", "-w", help="Working directory (default: work/<recipe name>)."),
    set_: list[str] | None = SetOption,
) -> None:
    """Run a whole recipe: prepare → train → average → evaluate, skipping finished stages.

    Reads: the recipe and the data it names. Writes to WORK: data/, run/ and
    test.hyp, and prints the test scores and a few example translations.

    \b
    Example:
      mtkit run recipes/demo.yaml
    """
    from mtkit.commands.run import run_recipe as run_all

    run_all(recipe, work or Path("work") / recipe.stem, set_ or [])


# -------------------------------------------------------------------- serve


@app.command()
def serve(
    model: list[Path] = typer.Option(..., "--model", "-m", help="Checkpoint or run directory (repeat to serve several "
                                     "models, each its own language pair; with --engine ctranslate2, exported directories "
                                     "too; with --engine onnx, folders mtkit export onnx wrote)."),
    engine: str = typer.Option("torch", "--engine", help=ENGINE_HELP),
    quantization: str | None = typer.Option(None, "--quantization", help="With --engine ctranslate2 on a checkpoint or run directory: its export's weights (int8, int8_float32, int16, float16, ...; default float32)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(5000, "--port", help="Port to listen on (0: one the OS picks; the address is printed)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 | bf16 | fp16 (fp16 on CUDA only)."),
    threads: int = typer.Option(0, "--threads", help="CPU threads of the engine per decoding thread (0: the CPUs "
                                "other work leaves free but one, which the HTTP side keeps, shared by the decoding threads; at least 1)."),
    beam: int | None = typer.Option(None, "--beam", "-b", help="Default beam size (requests may ask for another)."),
    alpha: float | None = typer.Option(None, "--alpha", help="Default length penalty α."),
    length_penalty: str | None = typer.Option(None, "--length-penalty", help="Default length penalty: gnmt | power."),
    max_len_a: float | None = typer.Option(None, "--max-len-a", help="Maximum output length = a·source + b."),
    max_len_b: int | None = typer.Option(None, "--max-len-b", help="Maximum output length = a·source + b."),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", help="Source tokens per decoding batch "
                                               "(decode.batch_tokens) and per merge of requests."),
    src_lang: str | None = typer.Option(None, "--src-lang", help="Source language code of every model (default: its config's data.src_lang)."),
    tgt_lang: str | None = typer.Option(None, "--tgt-lang", help="Target language code of every model (default: its config's data.tgt_lang)."),
    split: str | None = typer.Option(None, "--split", help="sentences: a line's sentences translated one by one and joined with the line's own whitespace (default; a request's split field too); none: each line one sentence."),
    guard: bool | None = typer.Option(None, "--guard/--no-guard", help="The integrity guard (default on; a request's guard field too): a sentence whose translation lacks a number, URL, e-mail address or placeholder of its source is searched again with it forced (torch engine; others report it); a repetition loop, again without repeating 3-grams."),
    shortlist: bool | None = typer.Option(None, "--shortlist/--no-shortlist", help="By default (a request's shortlist field too): " + SHORTLIST_HELP),
    api_keys: Path | None = typer.Option(None, "--api-keys", help="A file of API keys, one per line (# comments): /translate and /detect answer 400 without a key and 403 with a wrong one, as LibreTranslate does; /v1/translate answers 403 to both."),
    decoding_threads: int = typer.Option(2, "--decoding-threads", help="Batches of one model decoded at the same time (1-64), each in a thread of its own with --threads engine threads."),
    max_wait_ms: float = typer.Option(0.0, "--max-wait-ms", help="How long a request waits for others to be decoded with it (0: none; requests that arrive while the model decodes are batched together anyway)."),
    max_queue: int = typer.Option(256, "--max-queue", help="Requests waiting per model; beyond it 503 with Retry-After."),
    max_body_bytes: int = typer.Option(1 << 20, "--max-body-bytes", help="Largest request body (413 beyond)."),
    max_file_bytes: int = typer.Option(16 << 20, "--max-file-bytes", help="Largest document POST /translate_file takes (413 beyond; read no further); 0: file translation off (403, as LibreTranslate's --disable-files-translation)."),
    max_chars: int = typer.Option(20_000, "--max-chars", help="Characters of text per request (400 beyond)."),
    max_sentences: int = typer.Option(128, "--max-sentences", help="Lines of text per request (400 beyond)."),
    max_beam: int = typer.Option(8, "--max-beam", help="Largest beam a request may ask for."),
    graceful_timeout: float = typer.Option(30.0, "--graceful-timeout", help="Seconds to let requests in flight finish on SIGTERM / Ctrl-C."),
    access_log: bool = typer.Option(False, "--access-log", help="Log every request on stderr: method, path (no query string), status, milliseconds."),
    header_timeout: float = typer.Option(10.0, "--header-timeout", help="Seconds a connection may take to send a request's headers (from its opening or its last response); then it is closed."),
    body_timeout: float = typer.Option(20.0, "--body-timeout", help="Seconds a request's body may take to arrive (408 beyond)."),
    keep_alive_timeout: float = typer.Option(5.0, "--keep-alive-timeout", help="Seconds an idle kept-alive connection stays open."),
    max_connections: int = typer.Option(0, "--max-connections", help="Connections open at once; beyond them a new one gets 503 and is closed (0: half the process's file-descriptor limit, at most 1024)."),
    cors: bool = typer.Option(True, "--cors/--no-cors", help="Answer browsers of any origin on LibreTranslate's endpoints (CORS, as LibreTranslate does)."),
    glossary: Path | None = typer.Option(None, "--glossary", help="A server-wide glossary for every request: " + GLOSSARY_HELP),
    max_phrases: int = typer.Option(64, "--max-phrases", help="Constraint phrases per request, include and exclude, its glossary's matches too (400 beyond)."),
    qe_model: str | None = typer.Option(None, "--qe-model", help="A reference-free COMET model (hub name or folder, e.g. Unbabel/wmt22-cometkiwi-da; mtkit[comet]) for each translation's qe; without it qe is the model's confidence."),
    decode_timeout: float = typer.Option(60.0, "--decode-timeout", help="Seconds a request may take, queued and decoded; then 504, and its decoding stops. /health answers 503 when a queue is not moving for twice as long."),
) -> None:
    """Serve models over HTTP: LibreTranslate's API, mtkit's own (/v1/translate), a page at /.

    Needs the serve extra: pip install 'mtkit[serve]'. Endpoints: POST /translate, GET /languages,
    POST /detect, POST /translate_file (documents: their text translated, structure and formatting kept)
    and GET /download_file/NAME, GET /health, GET /frontend/settings, GET /spec (LibreTranslate's); POST /v1/translate
    (beam, n-best, scores, confidence, a quality estimate qe, constraints, glossary; LibreTranslate's
    /translate adds qe when asked with qe=true), GET /v1/models, GET /v1/health (models,
    queues; 503 when a queue is stuck),
    GET /metrics (Prometheus), GET /docs (OpenAPI). SIGTERM or Ctrl-C: stop accepting, finish the
    requests in flight, exit 0.

    \b
    Example:
      mtkit serve -m work/demo/run --port 5000
      curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
           -d '{"q": "two hundred five", "source": "en", "target": "de"}'
    """
    from mtkit.commands.serve import ServeOptions
    from mtkit.commands.serve import serve as run_serve
    from mtkit.config import DecodeOptions

    run_serve(list(model), ServeOptions(
        engine=engine, host=host, port=port, device=device, precision=precision, threads=threads,
        decode=DecodeOptions(beam=beam, alpha=alpha, length_penalty=length_penalty, max_len_a=max_len_a,
                             max_len_b=max_len_b, batch_tokens=batch_tokens, split=split, guard=guard,
                             shortlist=shortlist),
        src_lang=src_lang, tgt_lang=tgt_lang,
        api_keys=api_keys, decoding_threads=decoding_threads, max_wait_ms=max_wait_ms, max_queue=max_queue,
        max_body_bytes=max_body_bytes, max_file_bytes=max_file_bytes, max_chars=max_chars,
        max_sentences=max_sentences, max_beam=max_beam, graceful_timeout=graceful_timeout, access_log=access_log, glossary=glossary,
        header_timeout=header_timeout, body_timeout=body_timeout, keep_alive_timeout=keep_alive_timeout,
        max_connections=max_connections, cors=cors, max_phrases=max_phrases, decode_timeout=decode_timeout,
        quantization=quantization, qe_model=qe_model,
    ))


# ------------------------------------------------------- non-finite floats


def _float_flags(func) -> dict[str, str]:
    """{parameter: its flag} of ``func``'s float options (``float`` or ``Optional[float]``)."""
    hints = typing.get_type_hints(func)
    flags = {}
    for name, param in inspect.signature(func).parameters.items():
        tp = hints.get(name)
        if tp is float or (typing.get_origin(tp) in (typing.Union, types.UnionType) and float in typing.get_args(tp)):
            decls = [d for d in getattr(param.default, "param_decls", None) or () if d.startswith("--")]
            flags[name] = decls[0] if decls else "--" + name.replace("_", "-")
    return flags


def _finite_floats(func):
    """``func`` (a command) refusing nan and inf in its float options, as a one-line error naming
    the flag (:func:`mtkit.config.check_finite`), before it does anything."""
    flags = _float_flags(func)
    if not flags:
        return func

    @functools.wraps(func)
    def checked(*args, **kwargs):
        from mtkit.config import check_finite

        for name, flag in flags.items():
            if kwargs.get(name) is not None:
                check_finite(flag, kwargs[name])
        return func(*args, **kwargs)

    return checked


def refuse_non_finite(typer_app: typer.Typer) -> None:
    """Every float option of every command of ``typer_app`` (and of its sub-apps) refuses nan and inf."""
    for info in typer_app.registered_commands:
        if info.callback is not None and not hasattr(info.callback, "__wrapped__"):
            info.callback = _finite_floats(info.callback)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            refuse_non_finite(group.typer_instance)


refuse_non_finite(app)


# --------------------------------------------------------------------- main


def main() -> None:
    """Entry point: run the app and turn user errors into one line and their exit code.

    Exit codes: 0 success (also when the reader of stdout goes away: a broken pipe); 1 a user
    error; 2 a usage error (Click prints it); 130 / 143 interrupted by SIGINT / SIGTERM.
    """
    from mtkit.host_memory import keep_freed_memory

    debug = "--debug" in sys.argv[1:2]
    keep_freed_memory()
    try:
        app(prog_name="mtkit")
    except _Stop as e:
        if e.code == 0:
            # stdout's reader is gone: point stdout at /dev/null so that the final flush cannot fail
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        elif e.message:
            print(f"error: {e.message}", file=sys.stderr)
        sys.exit(e.code)
    except MtkitError as e:
        if debug or os.environ.get("MTKIT_DEBUG") == "1":
            raise
        if str(e):  # empty: another process (rank 0 of a launched training) printed it
            print(f"error: {e}", file=sys.stderr)
        if "TORCHELASTIC_RUN_ID" in os.environ:
            # A rank of a launched training: its process group's threads may still wait on a peer that has gone,
            # and tearing them down at exit can abort the process (gloo: "terminate called without an active
            # exception"), which the launcher would report as a second failure. The error is said, the files
            # are closed (the exception has left every `with`): leave without the interpreter's teardown.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.exit_code)
        sys.exit(e.exit_code)
    except OSError as e:  # the machine's, not mtkit's: a full disk, a permission, a missing device
        if debug or os.environ.get("MTKIT_DEBUG") == "1":
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        sys.exit(1)
