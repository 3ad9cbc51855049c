"""The cleaning report of a prepared directory: per rule and filter, the training pairs it dropped, their share
of the pairs read, and the first few of them, from ``manifest.json`` (``dropped`` and ``examples``); printed at
the end of ``mtkit prepare``, written with ``--report FILE`` as Markdown (``.md``) or JSON (any other name).

A rule or filter that drops more than ``data.clean.warn_share`` of the pairs read warns: a threshold set for
another corpus, or a language code that does not match the data, shows up here before a day of training.
"""

from __future__ import annotations

import json
from pathlib import Path

from mtkit.errors import counted
from mtkit.io import atomic_write_text


def cleaning_report(manifest: dict) -> list[dict]:
    """One section per training corpus (the single pair's, or each of ``data.pairs`` or ``data.corpora``): its
    name, pairs read and
    kept, and per rule (in the order they run) the count, the share of the pairs read and the examples."""
    entries = manifest.get("pairs") or manifest.get("corpora")  # a section per pair, or per corpus
    if entries:
        parts = [(f"train {e['name']}", e["splits"].get("train"), e["dropped"].get("train"),
                  e.get("examples", {}).get("train", {})) for e in entries]
    else:
        parts = [("train", manifest["splits"].get("train"), manifest["dropped"].get("train"),
                  manifest.get("examples", {}).get("train", {}))]
    sections = []
    for name, stats, dropped, examples in parts:
        if stats is None or dropped is None:
            continue
        read = stats["read"]
        sections.append({
            "corpus": name, "read": read, "kept": stats["pairs"],
            "rules": [{"rule": rule, "dropped": n, "share": n / read if read else 0.0,
                       "examples": examples.get(rule, [])} for rule, n in dropped.items()],
        })
    return sections


def share_warnings(sections: list[dict], share: float) -> list[str]:
    """A line for each rule or filter that dropped more than ``share`` of its corpus's pairs."""
    return [f"warning: {s['corpus']}: {r['rule']} dropped {r['dropped']} of {counted(s['read'], 'pair')} "
            f"({r['share']:.1%}, "
            f"over data.clean.warn_share {share:g}): check its settings against the examples in the report"
            for s in sections for r in s["rules"] if r["share"] > share]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _example(e: dict, width: int) -> str:
    if "src" not in e:
        return f"pair {e['pair']}: {e['why']}"
    return f"pair {e['pair']}: {e['why']}: {_clip(e['src'], width)!r} | {_clip(e['tgt'], width)!r}"


def render_text(sections: list[dict]) -> str:
    """The report as prepare prints it: a table per corpus, with each rule's first example."""
    lines = []
    for s in sections:
        lines.append(f"{s['corpus']}: kept {s['kept']} of {counted(s['read'], 'pair')}")
        width = max(len(r["rule"]) for r in s["rules"])
        for r in s["rules"]:
            first = f"  e.g. {_example(r['examples'][0], 40)}" if r["examples"] else ""
            lines.append(f"  {r['rule']:<{width}} {r['dropped']:>9} {r['share']:>7.2%}{first}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render_markdown(sections: list[dict]) -> str:
    """The report as Markdown: a table per corpus, then every example kept of each rule."""
    out = ["# Cleaning report", ""]
    for s in sections:
        out += [f"## {s['corpus']}: kept {s['kept']:,} of {counted(s['read'], 'pair', spec=',')}", "",
                "| rule | dropped | share of read |", "|---|---:|---:|"]
        out += [f"| {r['rule']} | {r['dropped']:,} | {r['share']:.2%} |" for r in s["rules"]]
        out.append("")
        for r in s["rules"]:
            if not r["examples"]:
                continue
            out += [f"### {r['rule']}", "", "| pair | why | source | target |", "|---:|---|---|---|"]
            out += [f"| {e['pair']} | {_cell(e['why'])} | {_cell(e.get('src') or '')} | {_cell(e.get('tgt') or '')} |"
                    for e in r["examples"]]
            out.append("")
    return "\n".join(out)


def write_report(sections: list[dict], path: Path) -> None:
    """Markdown for a ``.md`` name, else JSON; written whole or not at all."""
    if path.suffix.lower() in (".md", ".markdown"):
        text = render_markdown(sections)
    else:
        text = json.dumps(sections, indent=2, ensure_ascii=False) + "\n"
    atomic_write_text(path, text)
