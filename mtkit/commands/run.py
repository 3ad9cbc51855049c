"""``mtkit run``: a whole recipe, prepare → train → average → evaluate, skipping finished stages.

Layout of the working directory::

    WORK/distill/       with ``distill.teacher``: the teacher's translations of the training sources, the
                        student's training pairs (mtkit.training.distill); the rest is the student's
    WORK/data/          the prepared data (reused when complete and up to date)
    WORK/run/           the training run (resumed when interrupted; skipped when finished)
    WORK/run-2/, …      the other members when ``train.ensemble`` > 1 (each resumed or skipped alike)
    WORK/test.hyp       translations of the test split by the run's checkpoint (averaged, else the moving
                        average ema.pt, else best or last), or by the ensemble of the members' checkpoints
    WORK/scores.json    the scores printed at the end
    WORK/test.PAIR.hyp  a multilingual recipe's translations, per pair (PAIR: en-de …), and its
    WORK/test.PAIR.ref  references (scores.json then holds {"pairs": {PAIR: scores}})
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

from mtkit.api import LoadOptions, load_models
from mtkit.checkpoints.io import resolve_checkpoint
from mtkit.commands.evaluate import to_document
from mtkit.commands.prepare import prepare
from mtkit.commands.processes import member_run_dirs, timed_mtkit, train_members, usable_cores
from mtkit.commands.shortlist import build_shortlist
from mtkit.commands.train import train
from mtkit.config import Config, load_config
from mtkit.data.languages import stored_pairs
from mtkit.data.store import load_manifest
from mtkit.errors import MtkitError, counted
from mtkit.export.cache import ctranslate2_model
from mtkit.io import atomic_write_text, read_lines
from mtkit.metrics import MetricOptions, load_testset
from mtkit.metrics.files import score_files
from mtkit.shortlist import shortlist_path
from mtkit.text import pipeline
from mtkit.training.curves import read_metrics
from mtkit.training.distill import distill, teacher_decoding

logger = logging.getLogger(__name__)


def _say(message: str) -> None:
    logger.info(f"[mtkit run] {message}")


class _RunPrefix(logging.Filter):
    """Marks a library logger's messages as run's own lines (``[mtkit run] ``): the distillation stage's."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = f"[mtkit run] {record.getMessage()}", ()
        return True


class StageTimes:
    """How long each stage took, said on stderr as each ends and kept for ``scores.json``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._start, 1)
        self._start = now
        _say(f"{stage}: {_duration(self.seconds[stage])}")


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


def training_finished(run_dir: Path) -> bool:
    """Whether the run's log ends with the end-of-training record."""
    log = run_dir / "metrics.jsonl"
    records = read_metrics(log) if log.is_file() else []
    return bool(records) and records[-1].get("event") == "end"


def translate_lines(checkpoints: list[Path], lines: list[str], config: Config,
                    target: str | None = None) -> tuple[list[str], bool]:
    """Detokenized translations of ``lines`` by ``checkpoints`` (one, or an ensemble) with the recipe's decode
    section (with any --set; not the one saved in the checkpoint), into ``target`` (a multilingual recipe's
    pair's), and whether the model's target vocabulary lowercases (``data.spm.lowercase``)."""
    model = load_models(checkpoints, LoadOptions(engine="torch", threads=0, target=target, any_target=False,
                                                 decode=config.decode))
    return [t.best.text for t in pipeline.translate_lines(model.engine, lines)], model.lowercases


def final_checkpoint(run_dir: Path) -> Path:
    """The run's averaged checkpoint, else its moving average (each unless training went on past it), else its
    best or last."""
    return resolve_checkpoint(run_dir)


def run_recipe(recipe: Path, work: Path, overrides: list[str]) -> dict:
    """Run every stage of ``recipe`` in ``work``; print scores and example translations."""
    config: Config = load_config(recipe, overrides)
    work = Path(work)
    data_dir, run_dir = work / "data", work / "run"
    started = time.perf_counter()
    stages = StageTimes()

    if config.distill.teacher:  # the teacher's translations become this recipe's training data
        _say(f"distill with {', '.join(config.distill.teacher)} → {work / 'distill'}")
        said, prefix = logging.getLogger(distill.__module__), _RunPrefix()
        said.addFilter(prefix)  # its lines are run's stage lines
        try:
            config = distill(config, work / "distill")
        finally:
            said.removeFilter(prefix)
        stages.done("distill")

    _say(f"prepare → {data_dir}")
    prepare(config, data_dir)
    stages.done("prepare")

    members = config.train.ensemble
    if members > 1:
        run_dirs = member_run_dirs(run_dir, members)
        todo = [k for k, d in enumerate(run_dirs, 1) if not training_finished(d)]
        for k, d in enumerate(run_dirs, 1):
            _say(f"train member {k} of {members} → {d}" if k in todo else f"train: {d} has finished; skipped")
        if todo:
            train_members(config, data_dir, run_dir, members=todo)
    else:
        run_dirs = [run_dir]
        if training_finished(run_dir):
            _say(f"train: {run_dir} has finished; skipped")
        else:
            _say(f"train → {run_dir}")
            train(config, data_dir, run_dir)
    stages.done("train")
    if config.shortlist.build:  # the recipe asks for a vocabulary shortlist (docs/shortlist.md)
        for d in run_dirs:
            if not shortlist_path(d).is_file():
                _say(f"shortlist → {shortlist_path(d)}")
                build_shortlist(d)

    checkpoints = [final_checkpoint(d) for d in run_dirs]
    described = str(checkpoints[0]) if members == 1 else f"the ensemble of {', '.join(map(str, checkpoints))}"
    if config.data.pairs:
        return evaluate_pairs(config, work, data_dir, checkpoints, described, started, stages)
    ev = config.eval
    if ev.testset:
        sources, references = load_testset(ev.testset, ev.langpair or f"{config.data.src_lang}-{config.data.tgt_lang}")
        ref_path = work / "test.ref"
        atomic_write_text(ref_path, "".join(line + "\n" for line in references[0]))
    else:
        sources = list(read_lines(data_dir / "test.src.txt"))
        ref_path = data_dir / "test.tgt.txt"
    _say(f"translate {len(sources)} test sentences with {described} (beam {config.decode.beam}, "
         f"{config.decode.length_penalty} length penalty α {config.decode.alpha})")
    # The recipe's decode section (with any --set) decides, not the one saved in the checkpoint.
    hypotheses, lowercase = translate_lines(checkpoints, sources, config)
    hyp_path = work / "test.hyp"
    atomic_write_text(hyp_path, "".join(line + "\n" for line in hypotheses))
    stages.done("translate")

    lang = config.data.tgt_lang
    if lowercase:
        _say("the model's vocabulary lowercases its output (data.spm.lowercase): BLEU and chrF are case-insensitive")
    evaluation = score_files([hyp_path], [ref_path], ev.metrics, MetricOptions(lang=lang, lowercase=lowercase))
    if ev.lc_tok_ref:
        lc = score_files([hyp_path], [Path(ev.lc_tok_ref)], ["bleu"], MetricOptions(lowercase_tok=True, lang=lang))
        evaluation.scores += [s for s in lc.scores if s.metric != "BLEU"]
    if ev.compound_split:
        cs = score_files([hyp_path], [ref_path], ["bleu"], MetricOptions(compound_split=True, lang=lang))
        evaluation.scores += [s for s in cs.scores if s.metric != "BLEU"]
    scores = to_document(evaluation)
    stages.done("score")
    scores["checkpoint"] = str(checkpoints[0]) if members == 1 else [str(c) for c in checkpoints]
    scores["minutes"] = (time.perf_counter() - started) / 60
    scores["stage_seconds"] = stages.seconds
    atomic_write_text(work / "scores.json", json.dumps(scores, indent=2) + "\n")

    print(f"test set: {ref_path} ({counted(len(sources), 'sentence')}), "
          f"{'checkpoint' if members == 1 else 'models'} {described}")
    for s in scores["scores"]:
        print(f"{s['metric']:>18} {s['score']:6.2f}   {s['signature']}")
    if ev.examples:
        print("examples:")
        for src, hyp, ref in list(zip(sources, hypotheses, read_lines(ref_path)))[: ev.examples]:
            print(f"  src: {src}\n  hyp: {hyp}\n  ref: {ref}")
    if config.distill.teacher and members == 1 and config.distill.engine_table != "off":
        _say("engines: the teacher and the student in torch fp32, CTranslate2 fp32 and int8, each in its own process")
        src_path = work / "test.src"
        atomic_write_text(src_path, "".join(line + "\n" for line in sources))
        rows = engine_table(config, work / "engines", checkpoints[0], src_path, ref_path, lowercase)
        atomic_write_text(work / "engines.json", json.dumps(rows, indent=2) + "\n")
        print_engine_table(rows, len(sources))
        stages.done("engines")
    return scores


# Each model of a distillation recipe in each engine: (engine, weights, the flags that ask for it).
TABLE_ENGINES = (("torch", "fp32", []), ("ctranslate2", "fp32", ["--engine", "ctranslate2"]),
                 ("ctranslate2", "int8", ["--engine", "ctranslate2", "--quantization", "int8"]))
LATENCY_SENTENCES = 100  # translated one by one (--batch-tokens 1) for the batch-1 figures


def engine_table(config: Config, folder: Path, student: Path, src_path: Path, ref_path: Path,
                 lowercase: bool) -> list[dict]:
    """The teacher and the student in each of :data:`TABLE_ENGINES`, each decoding as its recipe says (the
    teacher: :func:`~mtkit.training.distill.teacher_decoding`, as it distilled; the student: ``config.decode``):
    BLEU (and lc-tok BLEU with ``eval.lc_tok_ref``) of the batched translation of the test sources, the speeds
    of :func:`fastest`, the weights' size on disk and the peak resident memory."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = list(read_lines(src_path))
    first = folder / "first.src"
    atomic_write_text(first, "".join(line + "\n" for line in sources[:LATENCY_SENTENCES]))
    rows = []
    for role, models, d in (("teacher", [Path(p) for p in config.distill.teacher], teacher_decoding(config)),
                            ("student", [student], config.decode)):
        decoding = ["--beam", str(d.beam), "--alpha", repr(d.alpha), "--length-penalty", d.length_penalty,
                    "--max-len-a", repr(d.max_len_a), "--max-len-b", str(d.max_len_b)]
        for engine, weights, flags in TABLE_ENGINES:
            if engine == "ctranslate2" and len(models) > 1:
                continue  # CTranslate2 translates one model, not an ensemble
            base = ["translate", *(a for m in models for a in ("-m", str(m))), *flags, *decoding]
            sweep = config.distill.engine_table == "full"
            speed = {"batched": fastest(base, src_path, sweep),
                     "batch 1": fastest([*base, "--batch-tokens", "1"], first, sweep)}
            hyp = folder / f"{role}.{engine}.{weights}.hyp"
            atomic_write_text(hyp, speed["batched"].pop("output"))
            speed["batch 1"].pop("output")
            if engine == "torch":
                size = sum(resolve_checkpoint(m, note=False).stat().st_size for m in models)
            else:
                exported = ctranslate2_model(models[0], None if weights == "fp32" else weights, quiet=True)
                size = (exported / "model.bin").stat().st_size
            rows.append({"model": role, "engine": engine, "weights": weights, "beam": d.beam,
                         "scores": _bleu(config, hyp, ref_path, lowercase), "size_bytes": size,
                         "peak_bytes": max(v["peak_bytes"] for v in speed.values()), **speed,
                         "hypotheses": str(hyp)})
    return rows


def fastest(args: list[str], src_path: Path, sweep: bool = True) -> dict:
    """``mtkit translate ARGS < src_path`` in a process of its own (:func:`mtkit.commands.processes.timed_mtkit`)
    with 1 thread and with 2 (where there are 2 CPUs), each with OpenMP's wait policy as it is and ``PASSIVE``
    (which suits an engine depends on the engine and the batch; ``sweep`` False: 1 thread, the policy as it is,
    once: ``distill.engine_table: quick``), the fastest kept: sentences and target words
    per second over the time translate says it took (its start and the model's loading apart), its threads and
    policy, its peak resident memory and its output."""
    best: dict = {}
    for threads in sorted({1, min(2, usable_cores())}) if sweep else [1]:
        for policy in (None, "PASSIVE") if sweep else (None,):
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
            if policy is not None:
                env["OMP_WAIT_POLICY"] = policy
            timed = timed_mtkit([*args, "--threads", str(threads)], src_path, env)
            seconds = translation_seconds(timed.stderr)
            if not best or seconds < best["seconds"]:
                lines = timed.stdout.splitlines()
                best = {"seconds": seconds, "sentences_per_s": len(lines) / seconds,
                        "words_per_s": sum(len(line.split()) for line in lines) / seconds, "threads": threads,
                        "omp_wait_policy": policy or "default", "peak_bytes": timed.peak_bytes,
                        "process_seconds": timed.seconds, "output": timed.stdout}
    return best


def _bleu(config: Config, hyp: Path, ref_path: Path, lowercase: bool) -> dict[str, float]:
    """sacreBLEU of ``hyp`` and, with ``eval.lc_tok_ref``, lc-tok BLEU (``BLEU-lc-tok``)."""
    lang = config.data.tgt_lang
    scores = {s.metric: s.score for s in score_files([hyp], [ref_path], ["bleu"],
                                                      MetricOptions(lang=lang, lowercase=lowercase)).scores}
    if config.eval.lc_tok_ref:
        lc = score_files([hyp], [Path(config.eval.lc_tok_ref)], ["bleu"],
                         MetricOptions(lowercase_tok=True, lang=lang)).scores
        scores.update({s.metric: s.score for s in lc if s.metric != "BLEU"})
    return scores


def translation_seconds(stderr: str) -> float:
    """The seconds ``mtkit translate`` says it translated for (its last stderr line; loading not counted)."""
    found = re.findall(r"^translated \d+ lines in ([\d.]+) s", stderr, re.MULTILINE)
    if not found:
        raise MtkitError(f"mtkit translate said no time: {stderr.strip().splitlines()[-1:]}")
    return max(float(found[-1]), 1e-3)


def print_engine_table(rows: list[dict], sentences: int) -> None:
    """The engine table on stdout, then the student's speed and BLEU beside the teacher's in each engine."""
    print(f"engines ({sentences} test sentences batched, the first {min(sentences, LATENCY_SENTENCES)} one by one; "
          "each figure the fastest of 1 and 2 threads, OMP_WAIT_POLICY as it is and PASSIVE; a process's start "
          "and loading not counted):")
    header = ("model", "engine", "weights", "beam", "BLEU", "lc-tok", "sent/s b1", "words/s b1", "sent/s", "words/s",
              "size MB", "peak MB")
    print("  " + "  ".join(f"{h:>10}" for h in header))
    for r in rows:
        cells = (r["model"], r["engine"], r["weights"], r["beam"], f"{r['scores'].get('BLEU', float('nan')):.2f}",
                 f"{r['scores']['BLEU-lc-tok']:.2f}" if "BLEU-lc-tok" in r["scores"] else "-",
                 f"{r['batch 1']['sentences_per_s']:.1f}", f"{r['batch 1']['words_per_s']:.0f}",
                 f"{r['batched']['sentences_per_s']:.1f}", f"{r['batched']['words_per_s']:.0f}",
                 f"{r['size_bytes'] / 1e6:.1f}", f"{r['peak_bytes'] / 1e6:.0f}")
        print("  " + "  ".join(f"{c:>10}" for c in cells))
    by = {(r["model"], r["engine"], r["weights"]): r for r in rows}
    for (model, engine, weights), student in by.items():
        teacher = by.get(("teacher", engine, weights))
        if model != "student" or teacher is None:
            continue
        ratio = {k: student[k]["sentences_per_s"] / teacher[k]["sentences_per_s"] for k in ("batch 1", "batched")}
        delta = student["scores"].get("BLEU", 0.0) - teacher["scores"].get("BLEU", 0.0)
        print(f"  student / teacher, {engine} {weights}: {ratio['batch 1']:.2f}x sentences/s at batch 1, "
              f"{ratio['batched']:.2f}x batched, BLEU {delta:+.2f}")


def evaluate_pairs(config: Config, work: Path, data_dir: Path, checkpoints: list[Path], described: str,
                   started: float, stages: StageTimes) -> dict:
    """A multilingual recipe's test: each pair's segment of the test split translated into its target
    (its tag) and scored on its own, sacreBLEU first, then lc-tok BLEU against the pair's
    ``lc_tok_ref`` or, without one, its raw references lowercased and tokenized.

    Writes ``WORK/test.PAIR.hyp`` and ``WORK/test.PAIR.ref`` per pair and ``WORK/scores.json`` with
    ``{"pairs": {PAIR: the evaluate --json document}, …}``."""
    ev = config.eval
    sources_all = list(read_lines(data_dir / "test.src.txt")) if (data_dir / "test.src.txt").is_file() else []
    references_all = list(read_lines(data_dir / "test.tgt.txt")) if sources_all else []
    lc_refs = {f"{p.src_lang}-{p.tgt_lang}": p.lc_tok_ref for p in config.data.pairs}
    scores: dict = {"pairs": {}}
    for stored in stored_pairs(load_manifest(data_dir)):
        segment = stored.segment("test")
        if segment is None:
            continue
        name, lang = stored.pair.name, stored.pair.tgt_lang
        start, count = segment
        sources, references = sources_all[start : start + count], references_all[start : start + count]
        _say(f"translate {count} {name} test sentences into {lang} with {described} (beam {config.decode.beam}, "
             f"{config.decode.length_penalty} length penalty α {config.decode.alpha})")
        hypotheses, lowercase = translate_lines(checkpoints, sources, config, lang)
        hyp_path, ref_path = work / f"test.{name}.hyp", work / f"test.{name}.ref"
        atomic_write_text(hyp_path, "".join(line + "\n" for line in hypotheses))
        atomic_write_text(ref_path, "".join(line + "\n" for line in references))
        evaluation = score_files([hyp_path], [ref_path], ev.metrics, MetricOptions(lang=lang, lowercase=lowercase))
        lc_ref = Path(lc_refs[name]) if lc_refs.get(name) else ref_path
        lc = score_files([hyp_path], [lc_ref], ["bleu"], MetricOptions(lowercase_tok=True, lang=lang))
        evaluation.scores += [s for s in lc.scores if s.metric != "BLEU"]
        scores["pairs"][name] = to_document(evaluation)
        print(f"test set {name}: {ref_path} ({counted(count, 'sentence')}), "
              f"{'checkpoint' if len(checkpoints) == 1 else 'models'} {described}")
        for s in scores["pairs"][name]["scores"]:
            print(f"{s['metric']:>18} {s['score']:6.2f}   {s['signature']}")
        if ev.examples:
            print("examples:")
            for src, hyp, ref in list(zip(sources, hypotheses, references))[: ev.examples]:
                print(f"  src: {src}\n  hyp: {hyp}\n  ref: {ref}")
    stages.done("translate and score")
    scores["checkpoint"] = str(checkpoints[0]) if len(checkpoints) == 1 else [str(c) for c in checkpoints]
    scores["minutes"] = (time.perf_counter() - started) / 60
    scores["stage_seconds"] = stages.seconds
    atomic_write_text(work / "scores.json", json.dumps(scores, indent=2) + "\n")
    return scores
