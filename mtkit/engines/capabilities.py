"""What each engine can do, declared once: word alignments, include and exclude constraints, devices, the
weight types of its exports, ensembles, attention maps, forced scoring, epsilon sampling.

Every caller (the commands, the API, the server and its page, the engines themselves) reads
:data:`CAPABILITIES` instead of knowing an engine by name, and the messages that refuse what an engine cannot
do are built from it (:func:`include_refusal`, :func:`no_alignments`). Plain data, no imports: reading it
loads neither torch nor an engine.

A capability says what an engine of that kind can do; one model may still lack it (a CTranslate2 export
that declares no alignment head gives no alignments: :attr:`mtkit.engines.engine.Engine.gives_alignments`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What one engine (``--engine name``) can do."""

    name: str  # --engine's value
    title: str  # how messages name it
    alignments: bool  # word alignments (from one teacher-forced pass of its attention)
    include: bool  # include constraints: phrases forced into a translation (and so glossaries)
    exclude: bool  # exclude constraints: phrases a translation must not hold
    devices: tuple[str, ...]  # the devices it computes on ("cuda" stands for cuda:N too)
    quantizations: tuple[str, ...] = ()  # the weight types of its exports (--quantization); (): none
    ensembles: bool = False  # several models at once
    attention_maps: bool = False  # --attention-png (the model's attention, drawn)
    forced_scoring: bool = False  # the log-probability of a given translation (mtkit score, Model.score)
    epsilon: bool = True  # epsilon sampling (--epsilon)
    shortlist: bool = False  # a vocabulary shortlist (--shortlist, decode.shortlist; mtkit.shortlist)
    alignments_when: str = ""  # what a model needs to give alignments, where not every one does
    no_alignments_why: str = ""  # why it gives none, where it gives none


TORCH = Capabilities("torch", "torch", alignments=True, include=True, exclude=True, devices=("cpu", "cuda"),
                     ensembles=True, attention_maps=True, forced_scoring=True, shortlist=True)
CTRANSLATE2 = Capabilities(
    "ctranslate2", "CTranslate2", alignments=True, include=False, exclude=True, devices=("cpu", "cuda"),
    quantizations=("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
                   "float32"),
    epsilon=False, shortlist=True, alignments_when="a CTranslate2 model exported by mtkit declares its alignment head")
ONNX = Capabilities("onnx", "ONNX", alignments=False, include=False, exclude=False, devices=("cpu",),
                    no_alignments_why="the ONNX export's graphs give no attention")

CAPABILITIES: dict[str, Capabilities] = {c.name: c for c in (TORCH, CTRANSLATE2, ONNX)}
ENGINES = tuple(CAPABILITIES)  # what --engine takes


def engines_with(feature: str) -> list[Capabilities]:
    """The engines that have ``feature`` (a field of :class:`Capabilities`), in :data:`ENGINES` order."""
    return [c for c in CAPABILITIES.values() if getattr(c, feature)]


def engines_without(feature: str) -> list[Capabilities]:
    return [c for c in CAPABILITIES.values() if not getattr(c, feature)]


def either(feature: str) -> str:
    """The names of the engines with ``feature``, as a flag's choices: ``torch or ctranslate2``."""
    return " or ".join(c.name for c in engines_with(feature))


def no_alignments() -> str:
    """Which engines give no word alignments, and which models of the others do not:
    ``a CTranslate2 model exported by mtkit declares its alignment head; ONNX gives none``."""
    return "; ".join([c.alignments_when for c in engines_with("alignments") if c.alignments_when]
                     + [f"{c.title} gives none" for c in engines_without("alignments")])


def shortlist_refusal(engine: str) -> str | None:
    """The one line refusing ``--shortlist`` on ``engine``, or None where it is taken."""
    c = CAPABILITIES.get(engine)
    if c is None or c.shortlist:
        return None
    return f"--shortlist needs --engine {either('shortlist')}: {c.title} has no vocabulary shortlist"


def include_refusal(engine: str) -> str | None:
    """The one line refusing include phrases (and so glossaries) on ``engine``, which takes exclude phrases
    only; None for an engine that takes them (or takes no constraints at all: the engine itself refuses those,
    :meth:`mtkit.engines.engine.Engine.search_constrained_batch`)."""
    c = CAPABILITIES.get(engine)
    if c is None or c.include or not c.exclude:
        return None
    takers = engines_with("exclude")
    return (f"--engine {c.name} cannot force phrases into a translation (include constraints, glossaries): "
            f"{c.title} has no constrained search; use --engine {either('include')} "
            f"(exclude works with {'both' if len(takers) == 2 else ', '.join(t.name for t in takers)})")
