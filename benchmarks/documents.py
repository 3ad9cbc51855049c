"""Documents: a 50-page .docx made from Multi30k captions, translated by ``mtkit translate`` as a document and, in
the same run, its paragraphs as plain lines (the same text without the document around it): time, peak memory,
and the share of formatted runs whose formatting landed on the aligned words.

    python benchmarks/documents.py --model ../shared/models/multi30k-en-de --multi30k ../shared/data/multi30k

Each page: a heading, 20 paragraphs of two captions each (a word of the first in bold, a word of the second in
italic: the longest word, so a content word), a table of 3 rows of captions, and the document has a header.
A run "landed" when every word of its translation is one that an independent aligner (eflomal, run on Multi30k's
training pairs with these paragraphs and their translations) aligns to the run's source word; "some of it" when
at least one is; "kept" counts runs that came back non-empty and not over the whole paragraph. Each command runs
in a process of its own; peak memory is that process's maximum resident set size.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORD = re.compile(r"[A-Za-z]+")


def build(captions: list[str], pages: int, path: Path) -> list[tuple[str, str, str]]:
    """Write the .docx; return each paragraph's (text, bold word, italic word)."""
    from docx import Document
    from docx.enum.text import WD_BREAK

    doc = Document()
    doc.sections[0].header.paragraphs[0].text = "A man is riding a bike."
    made, at = [], 0
    for page in range(pages):
        doc.add_heading(f"Two dogs play in the snow {page + 1}.", level=1)
        for _ in range(20):
            first, second = captions[at % len(captions)], captions[(at + 1) % len(captions)]
            at += 2
            bold = max(WORD.findall(first), key=len)
            italic = max(WORD.findall(second), key=len)
            p = doc.add_paragraph()
            b = first.index(bold)
            p.add_run(first[:b])
            p.add_run(bold).bold = True
            p.add_run(first[b + len(bold):] + " ")
            i = second.index(italic)
            p.add_run(second[:i])
            p.add_run(italic).italic = True
            p.add_run(second[i + len(italic):])
            made.append((first + " " + second, bold, italic))
        table = doc.add_table(rows=3, cols=1)
        for row in table.rows:
            row.cells[0].text = captions[at % len(captions)]
            at += 1
        doc.add_paragraph().add_run().add_break(WD_BREAK.PAGE)
    doc.save(path)
    return made


def measured(command: list[str]) -> tuple[float, float, str]:
    """Run ``command`` in a process of its own: (seconds, peak resident MiB, stderr)."""
    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); t = time.perf_counter() - t; "
             "sys.stderr.write(p.stderr); "
             "print(t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, p.returncode)")
    done = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, check=False)
    seconds, peak, code = done.stdout.split()
    if code != "0":
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return float(seconds), float(peak), done.stderr


def landed(source: Path, output: Path, made: list, multi30k: Path) -> dict:
    """Counts of formatted runs kept and landed: the words of a run's translation against the words an independent
    aligner (eflomal, on Multi30k's training pairs and these paragraphs) aligns to its source word."""
    from docx import Document

    from mtkit.data.alignments import eflomal_align
    from mtkit.data.word_alignment import word_spans

    source_paragraphs, out_paragraphs = Document(source).paragraphs, Document(output).paragraphs
    formatted = [k for k, p in enumerate(source_paragraphs) if any(r.bold or r.italic for r in p.runs)]
    pairs = [(source_paragraphs[k].text, out_paragraphs[k].text) for k in formatted]
    train = list(zip(Path(multi30k, "train.en").read_text(encoding="utf-8").splitlines(),
                     Path(multi30k, "train.de").read_text(encoding="utf-8").splitlines(), strict=True))
    links = eflomal_align([s for s, _ in train + pairs], [t for _, t in train + pairs])[len(train):]
    counts = {"runs": 0, "kept": 0, "landed": 0, "overlap": 0, "paragraphs_in": len(source_paragraphs),
              "paragraphs_out": len(out_paragraphs)}
    for k, line in zip(formatted, links, strict=True):
        pairs_ = {tuple(map(int, link.split("-"))) for link in line.split()}
        src, out = source_paragraphs[k], out_paragraphs[k]
        for flag in ("bold", "italic"):
            counts["runs"] += 1
            src_words = _words_of(src.runs, flag, word_spans(src.text))
            got = _words_of(out.runs, flag, word_spans(out.text))
            if not got or len(got) >= len(word_spans(out.text)):
                continue
            counts["kept"] += 1
            wanted = {t for s, t in pairs_ if s in src_words}
            if got & wanted:
                counts["overlap"] += 1
                if got <= wanted:
                    counts["landed"] += 1
    return counts


def _words_of(runs, flag: str, spans: list[tuple[int, int]]) -> set[int]:
    """The whitespace words (indices) holding a character of a run with ``flag`` (bold, italic)."""
    at, marked = 0, []
    for r in runs:
        if getattr(r, flag) and r.text.strip():
            marked.append((at, at + len(r.text)))
        at += len(r.text)
    return {i for i, (a, b) in enumerate(spans) if any(a < e and s < b for s, e in marked)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT.parent / "shared/models/multi30k-en-de"))
    parser.add_argument("--multi30k", default=str(ROOT.parent / "shared/data/multi30k"))
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    captions = Path(args.multi30k, "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        made = build(captions, args.pages, tmp / "doc.docx")
        lines = [text for text, _, _ in made]
        (tmp / "doc.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        mtkit_cli = [sys.executable, "-m", "mtkit", "translate", "-m", args.model]
        t_doc, m_doc, _ = measured(mtkit_cli + [str(tmp / "doc.docx"), "-o", str(tmp / "out.docx")])
        t_txt, m_txt, _ = measured(mtkit_cli + [str(tmp / "doc.txt"), "-o", str(tmp / "out.txt")])
        counts = landed(tmp / "doc.docx", tmp / "out.docx", made, Path(args.multi30k))
    result = {"pages": args.pages, "paragraphs": len(made), "docx_s": round(t_doc, 2), "docx_peak_mib": round(m_doc),
              "lines_s": round(t_txt, 2), "lines_peak_mib": round(m_txt), "time_ratio": round(t_doc / t_txt, 2),
              **counts, "kept_share": round(counts["kept"] / counts["runs"], 3),
              "landed_share": round(counts["landed"] / counts["runs"], 3),
              "overlap_share": round(counts["overlap"] / counts["runs"], 3)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{time.strftime('%Y-%m-%d')}: {args.pages} pages, {len(made)} formatted paragraphs (+ headings, tables)")
    print(f"  .docx as a document: {t_doc:7.1f} s  peak {m_doc:5.0f} MiB")
    print(f"  its paragraphs as lines: {t_txt:7.1f} s  peak {m_txt:5.0f} MiB   (document / lines: "
          f"{t_doc / t_txt:.2f}x; the lines hold no tables, headings or header)")
    print(f"  formatted runs: {counts['runs']}, kept {result['kept_share']:.1%}; on eflomal's aligned words: all of "
          f"the run {result['landed_share']:.1%}, some of it {result['overlap_share']:.1%}; paragraphs "
          f"{counts['paragraphs_in']} in, {counts['paragraphs_out']} out")


if __name__ == "__main__":
    main()
