"""Documents: a 50-page .docx made from Multi30k captions, translated by ``mtkit translate`` as a document and, in
the same run, its paragraphs as plain lines (the same text without the document around it): time, peak memory,
and the share of formatted runs whose formatting landed on the aligned words.

    python benchmarks/documents.py --model ../shared/models/multi30k-en-de --multi30k ../shared/data/multi30k

Each page: a heading, 20 paragraphs of two captions each (a word of the first in bold, a word of the second in
italic: the longest word, so a content word), a table of 3 rows of captions, and the document has a header.
A run "landed" when its translated text holds the translation of its source word (the word translated alone by
the same model; a shared prefix of 4 letters, or the whole of a shorter word, so that "rot" matches "roten");
"kept" counts runs that came back non-empty and not over the whole paragraph. Each command runs in a process of
its own; peak memory is that process's maximum resident set size.
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


def landed(source: Path, output: Path, made: list, model: str) -> dict:
    """Counts of formatted runs kept and landed on their translated words."""
    import mtkit
    from docx import Document

    out = [p for p in Document(output).paragraphs if any(r.bold or r.italic for r in p.runs)]
    words = sorted({w for _, b, i in made for w in (b, i)})
    alone = dict(zip(words, (r.text for r in mtkit.load(model).translate(words)), strict=True))
    counts = {"runs": 0, "kept": 0, "landed": 0, "paragraphs_in": len(Document(source).paragraphs),
              "paragraphs_out": len(Document(output).paragraphs)}
    for p, (_, bold, italic) in zip(out, made, strict=False):
        for flag, word in (("bold", bold), ("italic", italic)):
            counts["runs"] += 1
            text = "".join(r.text for r in p.runs if getattr(r, flag)).strip()
            if not text or len(text) >= len(p.text.strip()) - 1:
                continue
            counts["kept"] += 1
            wanted = [w.casefold() for w in WORD.findall(alone[word]) or [alone[word]]]
            got = [w.casefold() for w in re.findall(r"\w+", text)]
            if any(g[:4] == w[:4] or (len(w) < 4 and g.startswith(w)) for g in got for w in wanted):
                counts["landed"] += 1
    return counts


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
        counts = landed(tmp / "doc.docx", tmp / "out.docx", made, args.model)
    result = {"pages": args.pages, "paragraphs": len(made), "docx_s": round(t_doc, 2), "docx_peak_mib": round(m_doc),
              "lines_s": round(t_txt, 2), "lines_peak_mib": round(m_txt), "time_ratio": round(t_doc / t_txt, 2),
              **counts, "kept_share": round(counts["kept"] / counts["runs"], 3),
              "landed_share": round(counts["landed"] / counts["runs"], 3)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{time.strftime('%Y-%m-%d')}: {args.pages} pages, {len(made)} formatted paragraphs (+ headings, tables)")
    print(f"  .docx as a document: {t_doc:7.1f} s  peak {m_doc:5.0f} MiB")
    print(f"  its paragraphs as lines: {t_txt:7.1f} s  peak {m_txt:5.0f} MiB   (document / lines: "
          f"{t_doc / t_txt:.2f}x; the lines hold no tables, headings or header)")
    print(f"  formatted runs: {counts['runs']}, kept {result['kept_share']:.1%}, landed on the aligned words "
          f"{result['landed_share']:.1%}; paragraphs {counts['paragraphs_in']} in, {counts['paragraphs_out']} out")


if __name__ == "__main__":
    main()
