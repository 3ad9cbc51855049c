"""Imports go one way, layer by layer (:data:`LAYERS`):

    cli → commands → {serve, training} → api → {export, importers} → {text, visualize} → engines
    → {decoding, data, metrics, checkpoints} → {model, model_spec} → kernels
    → {config, errors, io, hub, logs, version, host_memory, langid}

Nothing imports a layer above its own (no exception), no two modules import each other, however
indirectly (:func:`test_no_circles_between_modules`), no package grows past :data:`MAX_PACKAGE_LINES`,
and every module has its imports at the top but those that must stay torch-free (:data:`TORCH_FREE`,
which import what needs torch where it is used) and an optional extra's import where it is used
(:data:`OPTIONAL`). Inference never imports training; decoding knows no files, no vocabularies, no engine.
"""

import ast
import functools
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mtkit"


def mtkit_imports(path: Path) -> set[str]:
    """The mtkit modules a file imports (at any level, lazily or not)."""
    found = set()
    for node in ast.walk(syntax(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mtkit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mtkit"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def syntax(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for all the tests here."""
    return ast.parse(path.read_text(encoding="utf-8"))


def files():
    return sorted(PACKAGE.rglob("*.py"))


def test_the_model_knows_only_the_config_and_the_kernels():
    assert all(m.startswith(("mtkit.config", "mtkit.kernels")) for m in mtkit_imports(PACKAGE / "model.py"))


def test_the_kernels_know_only_the_config():
    kernels = ([PACKAGE / "kernels.py"] if (PACKAGE / "kernels.py").exists()
               else sorted((PACKAGE / "kernels").glob("*.py")))
    assert kernels
    for path in kernels:
        bad = {m for m in mtkit_imports(path) if not m.startswith(("mtkit.config", "mtkit.kernels"))}
        assert not bad, f"{path.name} imports {bad}"


DECODING_MAY_IMPORT = ("mtkit.config", "mtkit.kernels", "mtkit.model", "mtkit.decoding")
# Modules outside mtkit that would give decoding files, text or processes to handle.
NOT_FOR_DECODING = ("os", "io", "pathlib", "shutil", "tempfile", "glob", "gzip", "json", "pickle", "csv",
                    "subprocess", "sentencepiece", "yaml", "numpy", "sacrebleu", "typer")


def test_decoding_sees_only_token_ids_and_the_model_protocol():
    """mtkit/decoding/ imports torch, the config's constants, the kernels, the model's types and itself:
    nothing of files, vocabularies, the runtime, data or training (phrases come in as token ids)."""
    paths = sorted((PACKAGE / "decoding").glob("*.py"))
    assert {p.name for p in paths} >= {"__init__.py", "options.py", "search.py", "constrained.py", "penalties.py",
                                       "ensemble.py", "forced.py"}
    for path in paths:
        bad = {m for m in mtkit_imports(path) if not m.startswith(DECODING_MAY_IMPORT)}
        assert not bad, f"decoding/{path.name} imports {bad}"
        for node in ast.walk(syntax(path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                assert name.split(".")[0] not in NOT_FOR_DECODING, f"decoding/{path.name} imports {name}"
        text = path.read_text(encoding="utf-8")
        assert "open(" not in text and "Vocab" not in text, f"decoding/{path.name} reads files or vocabularies"


def test_penalties_load_without_torch():
    """The CTranslate2 engine, which never loads torch, ranks with mtkit.decoding.penalties."""
    code = "import sys, mtkit.decoding.penalties\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_config_and_errors_depend_on_nothing_above_them():
    for path in [*(PACKAGE / "config").glob("*.py"), PACKAGE / "errors.py", PACKAGE / "io.py"]:
        assert all(m.startswith(("mtkit.errors", "mtkit.io", "mtkit.config")) for m in mtkit_imports(path)), path


def test_the_library_never_imports_the_commands_or_the_cli():
    for path in files():
        name = module_name(path)
        if name.startswith(("mtkit.cli", "mtkit.commands", "mtkit.__main__")):
            continue
        bad = {m for m in mtkit_imports(path) if m.startswith(("mtkit.cli", "mtkit.commands"))}
        assert not bad, f"{name} imports {bad}"


def test_commands_never_import_the_cli():
    for path in (PACKAGE / "commands").glob("*.py"):
        assert not {m for m in mtkit_imports(path) if m.startswith("mtkit.cli")}, path.name


def test_commands_import_no_other_command():
    """Each command is glue over the library, never over another command; the engine factory lives in
    mtkit.engines.factory. ``processes`` is no command (it starts processes for train and run), and
    ``run`` is the pipeline of prepare, train and evaluate, the one command made of commands."""
    for path in (PACKAGE / "commands").glob("*.py"):
        if path.stem in ("__init__", "processes", "run"):
            continue
        bad = {m for m in mtkit_imports(path)
               if m.startswith("mtkit.commands") and m != "mtkit.commands"
               and not m.startswith("mtkit.commands.processes")}
        assert not bad, f"{path.name} imports {bad}"


def test_data_knows_nothing_of_training_or_models():
    for path in (PACKAGE / "data").glob("*.py"):
        bad = {m for m in mtkit_imports(path) if m.startswith(("mtkit.training", "mtkit.model", "mtkit.decoding"))}
        assert not bad, f"{path.name} imports {bad}"


# Top-level modules and packages, layer by layer from the top: each imports only from its own layer or
# those below it, lazily or not. The package itself (``mtkit/__init__``: ``mtkit.load`` is the API) sits
# with the API; every module below reads the version from mtkit.version.
LAYERS = [
    {"mtkit.cli", "mtkit.__main__"},
    {"mtkit.commands"},
    {"mtkit.serve", "mtkit.training"},
    {"mtkit.api", "mtkit"},  # mtkit.load converts a run for CTranslate2 and imports a Marian folder
    {"mtkit.export", "mtkit.importers", "mtkit.documents"},
    {"mtkit.text", "mtkit.visualize"},
    {"mtkit.engines"},
    # mtkit.shortlist: the vocabulary shortlist's file, builder and a sentence's allowed ids (ids for decoding)
    {"mtkit.decoding", "mtkit.data", "mtkit.metrics", "mtkit.checkpoints", "mtkit.shortlist"},
    {"mtkit.model", "mtkit.model_spec"},
    {"mtkit.kernels"},
    # mtkit.langid: language identification (lingua), one job for the cleaning filter, the server and a command
    {"mtkit.config", "mtkit.errors", "mtkit.io", "mtkit.hub", "mtkit.logs", "mtkit.version", "mtkit.host_memory",
     "mtkit.langid"},
]
INFERENCE = ("mtkit.engines", "mtkit.decoding", "mtkit.export",
             "mtkit.commands.translate", "mtkit.commands.evaluate", "mtkit.commands.export",
             "mtkit.commands.score", "mtkit.serve", "mtkit.commands.serve")


def top_level(module: str) -> str:
    """``mtkit.training.trainer`` -> ``mtkit.training``; ``mtkit`` stays ``mtkit``."""
    return ".".join(module.split(".")[:2])


@functools.cache
def module_file(module: str) -> Path | None:
    """The file of an mtkit module (None for a name imported from a module, e.g. ``mtkit.config.PAD_ID``)."""
    base = PACKAGE.parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(path: Path) -> set[str]:
    """The mtkit modules a file names in its imports, at any level: ``from mtkit.checkpoints import file``
    names mtkit.checkpoints.file, ``from mtkit.config import PAD_ID`` names mtkit.config."""
    found = set()
    for node in ast.walk(syntax(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mtkit")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mtkit"):
            for a in node.names:
                found.add(f"{node.module}.{a.name}" if module_file(f"{node.module}.{a.name}") else node.module)
    return found


def import_graph(*, with_packages: bool = False) -> dict[str, set[str]]:
    """Module -> the mtkit modules it imports; with_packages: also the packages above each of them but
    mtkit itself (which Python runs first: what an import can load)."""
    graph = {}
    for path in files():
        found = set()
        for m in imported_modules(path):
            parts = m.split(".")
            found |= ({".".join(parts[:k]) for k in range(2, len(parts) + 1)} | {m}) if with_packages else {m}
        graph[module_name(path)] = found
    return graph


def layer_of(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if top_level(module) in layer:
            return i
    raise AssertionError(f"{module}: not in test_layout.LAYERS; add it to its layer")


def test_imports_go_down_the_layers():
    """Every import, at the top or in a function: a lazy import up is an arrow up all the same."""
    up = sorted(f"{module} imports {m}" for module, imported in import_graph().items() for m in imported
                if layer_of(m) < layer_of(module))
    assert not up, "imports from a layer below to one above:\n" + "\n".join(up)


def test_no_cycles_between_top_level_packages():
    edges: dict[str, set[str]] = {}
    for module, imported in import_graph(with_packages=True).items():
        here = top_level(module)
        edges.setdefault(here, set()).update(top_level(m) for m in imported if top_level(m) != here)
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import cycle: " + " → ".join(path[path.index(node):] + [node]))
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, path + [node])
        done.add(node)

    for node in sorted(edges):
        visit(node, [])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, however indirectly (strongly connected components
    of more than one module; Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "a"}}) == [["a", "b", "c"]]


def test_no_circles_between_modules():
    """No two modules import each other, however indirectly, at the top or in functions (a circle held
    apart by a lazy import is a circle all the same)."""
    found = circles(import_graph())
    assert not found, "modules that import one another:\n" + "\n".join(" ↔ ".join(g) for g in found)


MAX_PACKAGE_LINES = 3_100  # ~3k: a room a reader can walk through; past it, split it by job


def test_no_package_is_too_big():
    sizes: dict[str, int] = {}
    for path in files():
        if path.parent != PACKAGE:
            name = top_level(module_name(path))
            sizes[name] = sizes.get(name, 0) + len(path.read_text(encoding="utf-8").splitlines())
    big = sorted(f"{name}: {n:,} lines" for name, n in sizes.items() if n > MAX_PACKAGE_LINES)
    assert not big, f"packages over {MAX_PACKAGE_LINES:,} lines:\n" + "\n".join(big)


# The modules that must import without torch: what `import mtkit`, `mtkit --help`, `mtkit translate` and
# `mtkit evaluate` with `--engine ctranslate2`, and `mtkit serve` of a CTranslate2 model load (torch
# would cost seconds and, beside CTranslate2, slow it down), and the torch-free checks of a checkpoint
# (precheck, model_spec). These alone may import inside a function: what needs torch, where it is used.
TORCH_FREE = {
    "mtkit", "mtkit.version", "mtkit.cli", "mtkit.logs", "mtkit.errors", "mtkit.io", "mtkit.host_memory",
    "mtkit.langid", "mtkit.api",
    "mtkit.commands", "mtkit.commands.translate", "mtkit.commands.evaluate", "mtkit.commands.serve",
    "mtkit.commands.detect",
    "mtkit.commands.export",  # CTranslate2 before torch: `mtkit export ctranslate2` imports it first
    "mtkit.serve", "mtkit.serve.app", "mtkit.serve.server", "mtkit.serve.service", "mtkit.serve.schemas",
    "mtkit.serve.batcher", "mtkit.serve.libretranslate", "mtkit.serve.metrics", "mtkit.serve.models",
    "mtkit.serve.files",
    "mtkit.export", "mtkit.export.cache",
    "mtkit.text", "mtkit.text.lines", "mtkit.text.markup", "mtkit.text.phrases", "mtkit.text.glossary",
    "mtkit.text.pipeline", "mtkit.text.sentences", "mtkit.text.guard",
    "mtkit.documents",  # a format's module is imported when its format is asked for
    "mtkit.engines", "mtkit.engines.engine", "mtkit.engines.ctranslate2_engine", "mtkit.engines.factory",
    "mtkit.engines.threads", "mtkit.engines.device", "mtkit.engines.constraints", "mtkit.engines.mbr",
    "mtkit.engines.quality", "mtkit.engines.capabilities",
    "mtkit.checkpoints", "mtkit.checkpoints.file", "mtkit.checkpoints.io",
    "mtkit.data", "mtkit.data.store", "mtkit.data.vocab", "mtkit.data.word_alignment", "mtkit.data.languages",
    "mtkit.decoding", "mtkit.decoding.penalties",
    "mtkit.metrics", "mtkit.metrics.files", "mtkit.metrics.scores", "mtkit.metrics.testsets",
    "mtkit.metrics.tokenized",
    "mtkit.model_spec",
    "mtkit.config", "mtkit.config.loader", "mtkit.config.schema",
}
# What any module may import where it is used: an extra (pyproject's optional dependencies), a module
# only some platforms have, or a dependency that costs seconds to import and serves one feature (HF
# datasets as a corpus, pictures, Moses tokenization), so that a module works without it.
OPTIONAL = ("ctranslate2", "transformers", "safetensors", "onnx", "onnxscript", "onnxruntime", "huggingface_hub",
            "lingua", "eflomal", "fastapi", "fastapi_offline", "starlette", "uvicorn", "prometheus_client",
            "python_multipart", "torch.utils.tensorboard", "fcntl", "resource",
            "datasets", "matplotlib", "sacremoses",
            # the documents extra: each format's library where the format is read (mtkit.documents)
            "defusedxml", "lxml", "markdown_it")


def test_the_torch_free_modules_load_no_torch():
    assert all(module_file(m) for m in TORCH_FREE), sorted(m for m in TORCH_FREE if not module_file(m))
    code = ("import importlib, sys\n"
            f"for m in {sorted(TORCH_FREE)!r}:\n"
            "    try:\n"
            "        importlib.import_module(m)\n"
            "    except ModuleNotFoundError as e:  # a module of an extra not installed here (mtkit.serve's)\n"
            f"        if not (e.name or '').startswith({OPTIONAL!r}):\n"
            "            raise\n"
            "    if 'torch' in sys.modules:\n"
            "        sys.exit(f'importing {m} loaded torch')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def names_imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads: ``from mtkit.training import distributed`` loads
    mtkit.training.distributed, ``from mtkit.config import PAD_ID`` mtkit.config, ``from . import x`` "."."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level or not node.module:
        return ["." * node.level + (node.module or "")]
    if node.module.startswith("mtkit"):
        return sorted({f"{node.module}.{a.name}" if module_file(f"{node.module}.{a.name}") else node.module
                       for a in node.names})
    return [node.module]


def optional(name: str) -> bool:
    return any(name == o or name.startswith(o + ".") for o in OPTIONAL)


def guarded(fn: ast.AST) -> set[int]:
    """The imports in ``try:`` blocks that catch ImportError: a dependency that may be missing (protobuf)."""
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Try) and any(h.type is not None and "ImportError" in ast.unparse(h.type)
                                             for h in node.handlers):
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)
                      if isinstance(n, (ast.Import, ast.ImportFrom))}
    return found


def late_imported(path: Path) -> list[tuple[int, str]]:
    """The imports inside functions of a module (but an optional package's, or another's package guarded by
    ``except ImportError``), as (line, module)."""
    found = set()
    for fn in ast.walk(syntax(path)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            skip = guarded(fn)
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found |= {(node.lineno, name) for name in names_imported(node) if not optional(name)
                              and not (id(node) in skip and name.split(".")[0] not in ("mtkit", "torch"))}
    return sorted(found)


def late_imports(path: Path) -> list[str]:
    """The imports inside functions of a module (but an optional package's), as ``line: what``."""
    lines: dict[int, list[str]] = {}
    for line, name in late_imported(path):
        lines.setdefault(line, []).append(name)
    return [f"{line}: {', '.join(names)}" for line, names in sorted(lines.items())]


def top_imports(path: Path) -> list[str]:
    """The modules a file imports as it is imported: its imports outside functions (but those under
    ``if TYPE_CHECKING:``, which never run)."""
    found, todo = [], list(syntax(path).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += names_imported(node)
        todo += ast.iter_child_nodes(node)
    return found


@functools.cache
def loads(module: str) -> frozenset[str]:
    """The packages not ours that importing ``module`` loads, as the imports at the top of our modules say
    (the packages above a module run first)."""
    seen, todo, outside = set(), [module], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.split(".")[0] != "mtkit":
            outside.add(name)
            continue
        parts = name.split(".")
        todo += [m for k in range(1, len(parts) + 1) if (path := module_file(".".join(parts[:k])))
                 for m in top_imports(path)]
    return frozenset(outside)


def loads_torch(module: str) -> bool:
    return any(name == "torch" or name.startswith("torch.") for name in loads(module))


def loads_optional(module: str) -> bool:
    """Whether importing ``module`` needs an optional extra (mtkit.serve.app: FastAPI)."""
    return any(optional(name) for name in loads(module))


def test_imports_are_at_the_top_but_in_the_torch_free_modules():
    """Each module that needs torch anyway imports at the top (nanoGPT, Sockeye): its dependencies show in
    its first lines, an import error shows at once, and nothing is imported twice."""
    late = {module_name(p): late_imports(p) for p in files() if module_name(p) not in TORCH_FREE}
    late = {m: found for m, found in late.items() if found}
    assert not late, "imports inside functions:\n" + "\n".join(f"{m}: {found}" for m, found in sorted(late.items()))


# The torch-free modules' imports inside functions of what loads no torch, each with its reason.
LAZY_BY_DESIGN = {
    # PEP 562: the package runs before each of its modules, and the API imports them all; it loads on first use.
    "mtkit": ("mtkit.api",),
    # The CLI imports a command's modules when it runs: `mtkit --help` loads Typer and nothing of ours.
    "mtkit.cli": ("mtkit",),
}


def test_the_torch_free_modules_import_inside_functions_only_what_loads_torch():
    """A torch-free module imports inside a function only what would load torch (torch, or a module of ours
    that imports it at its top), an optional extra (or a module of ours that imports one at its top), or what
    :data:`LAZY_BY_DESIGN` names: everything else at its top, as every other module does."""
    wrong = sorted(m for m in TORCH_FREE if loads_torch(m))
    assert not wrong, f"the imports at the top say these load torch: {wrong}"  # as the subprocess test finds
    assert loads_torch("mtkit.model") and loads_torch("mtkit.engines.torch_engine")
    late = {}
    for path in files():
        module = module_name(path)
        if module in TORCH_FREE:
            lazy = LAZY_BY_DESIGN.get(module, ())
            found = [f"{line}: {name}" for line, name in late_imported(path)
                     if not loads_torch(name) and not loads_optional(name)
                     and not any(name == m or name.startswith(m + ".") for m in lazy)]
            if found:
                late[module] = found
    assert not late, ("torch-free imports inside functions of torch-free modules (move them to the top):\n"
                      + "\n".join(f"{m}: {found}" for m, found in sorted(late.items())))


def classes_in_functions(path: Path) -> list[str]:
    tree = syntax(path)
    return [f"{fn.name}.{node.name}" for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(fn) if isinstance(node, ast.ClassDef)]


def test_no_classes_inside_functions():
    """A class is defined once, at a module's top: a class built per call is a new type per call (its
    isinstance checks, pickling and caches see strangers), and hides from readers and tools."""
    found = {module_name(p): classes_in_functions(p) for p in files()}
    found = {m: names for m, names in found.items() if names}
    assert not found, "classes inside functions:\n" + "\n".join(f"{m}: {n}" for m, n in sorted(found.items()))


def test_inference_never_imports_training():
    graph = import_graph(with_packages=True)
    for start in (m for m in graph if m.startswith(INFERENCE)):
        seen, todo = set(), [start]
        while todo:  # everything it can load, lazily or not
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo += graph.get(module, ())
        bad = sorted(m for m in seen if m.startswith("mtkit.training"))
        assert not bad, f"{start} can load {bad}"


def test_importing_the_inference_path_loads_no_training_module():
    code = ("import sys, mtkit.text.lines, mtkit.engines, mtkit.engines.torch_engine, "
            "mtkit.engines.ctranslate2_engine, mtkit.checkpoints.io\n"
            "print(sorted(m for m in sys.modules if m.startswith('mtkit.training')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_only_the_commands_start_mtkit_processes():
    """torchrun ranks and ensemble members are launched in one place, mtkit.commands.processes; the
    library below it never builds an ``mtkit`` command line nor starts a process (prepare's worker
    pool forks functions, not commands)."""
    launchers = set()
    for path in files():
        text = path.read_text(encoding="utf-8")
        if any(s in text for s in ('"-m", "mtkit"', "subprocess", "elastic_launch")):
            launchers.add(module_name(path))
    assert launchers == {"mtkit.commands.processes"}


def test_training_knows_nothing_of_packing():
    """Inference weights are packed by whoever decodes (the torch engine, per construction): training imports
    nothing of it and does nothing for it (no version bumps after an optimizer step)."""
    for path in (PACKAGE / "training").glob("*.py"):
        bad = {m for m in mtkit_imports(path)
               if m.startswith(("mtkit.kernels.packed", "mtkit.kernels.linear", "mtkit.engines.inference"))}
        assert not bad, f"{path.name} imports {bad}"
        assert "increment_version" not in path.read_text(encoding="utf-8"), path.name


def test_no_module_level_cache_of_weights():
    """What is derived once from the weights belongs to the object that derived it: no module keeps a
    cache keyed on models or on parameters' identities or versions."""
    for path in files():
        text = path.read_text(encoding="utf-8")
        for sign in ("WeakKeyDictionary", "WeakValueDictionary", "data_ptr()", "._version"):
            assert sign not in text, f"{module_name(path)}: {sign}"


ENGINE_CLASSES = {"TorchEngine", "Ctranslate2Engine", "PairScorer"}


def test_engines_are_built_in_one_factory():
    """Every command, the server, evaluate, run, validation and the API build their engines (and forced
    decoding's scorer) through mtkit.engines.factory: nothing else calls the classes."""
    for path in files():
        if path == PACKAGE / "engines" / "factory.py":
            continue
        tree = syntax(path)
        calls = {node.func.id for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ENGINE_CLASSES}
        assert not calls, f"{path.relative_to(PACKAGE.parent)} builds {sorted(calls)} itself; use mtkit.engines.factory"


def test_command_functions_take_few_parameters():
    """Commands are glue: a command function takes a few arguments and one typed options object (ServeOptions,
    TranslateOptions, EvaluateOptions, DataFlags ...), never the CLI's flags one by one."""
    for path in sorted((PACKAGE / "commands").glob("*.py")):
        for node in syntax(path).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                count = len(node.args.posonlyargs) + len(node.args.args) + len(node.args.kwonlyargs)
                assert count <= 8, f"commands/{path.name}: {node.name} takes {count} parameters"


def test_checkpoints_are_written_and_read_in_one_module():
    """mtkit.checkpoints.io alone writes (torch.save) and reads (torch.load) mtkit checkpoints; training,
    average, the importers and the exporters go through it. (The Marian importer reads a Hugging Face
    pytorch_model.bin and COMET a Lightning checkpoint, not checkpoints of ours.)"""
    allowed = {PACKAGE / "checkpoints" / "io.py": {"save", "load"}, PACKAGE / "importers" / "marian.py": {"load"},
               PACKAGE / "metrics" / "comet.py": {"load"}}
    for path in files():
        tree = syntax(path)
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr in ("save", "load")}
        extra = used - allowed.get(path, set())
        assert not extra, f"{path.relative_to(PACKAGE.parent)} calls torch {sorted(extra)}: use mtkit.checkpoints.io"


def test_each_decode_rule_is_stated_once():
    """The decoding settings' rules live in mtkit.config.schema (DECODE_RANGES, check_decode), which the config,
    the flags, the server's requests and SearchOptions all go through: no other module compares nbest with
    beam, or keeps a table of the flags' ranges."""
    def names(node) -> set[str]:
        found = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                found.add(n.id)
            elif isinstance(n, ast.Attribute):
                found.add(n.attr)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                found.add(n.value)
        return found

    for path in files():
        if path == PACKAGE / "config" / "schema.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert "_FLAG_RANGES" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Compare) and {"nbest", "beam"} <= names(node):
                raise AssertionError(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} compares nbest with beam; "
                                     "the rule is mtkit.config.check_decode's")


# ---------------------------------------------------------------- mtkit.api, the one front door

ENGINE_BUILDERS = {"TorchEngine", "Ctranslate2Engine", "OnnxEngine", "PairScorer", "torch_engine", "forced_scorer",
                   "build_translator"}


def test_only_the_api_imports_the_engine_factory():
    """mtkit.engines.factory is mtkit.api's private helper: every other module gets its engines from the API."""
    for path in files():
        if path == PACKAGE / "api.py":
            continue
        bad = {m for m in mtkit_imports(path) if m.startswith("mtkit.engines.factory")}
        assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {sorted(bad)}; use mtkit.api (load_models)"


def test_engines_are_built_only_by_the_api_and_the_engines():
    """Outside mtkit/api.py and mtkit/engines/, nothing constructs an engine or forced decoding's scorer, nor
    calls the factory's builders (by name or as an attribute)."""
    for path in files():
        if path == PACKAGE / "api.py" or path.parent == PACKAGE / "engines":
            continue
        called = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in ENGINE_BUILDERS:
                    called.add(name)
        assert not called, f"{path.relative_to(PACKAGE.parent)} calls {sorted(called)}; use mtkit.api"


def test_the_commands_the_server_validation_and_distillation_use_the_api():
    """Those that translate or score with a model import mtkit.api (the door), and build nothing themselves."""
    users = [PACKAGE / "commands" / f"{name}.py" for name in ("translate", "score", "evaluate", "run", "serve")]
    users += [PACKAGE / "training" / "validation.py", PACKAGE / "training" / "distill.py"]
    for path in users:
        assert "mtkit.api" in mtkit_imports(path), f"{path.relative_to(PACKAGE.parent)} does not use mtkit.api"
    # The server's modules take the engines the serve command loaded through the API: none builds one.
    for path in sorted((PACKAGE / "serve").glob("*.py")):
        found = {m for m in mtkit_imports(path) if m.startswith(("mtkit.engines.factory", "mtkit.checkpoints.io"))}
        assert not found, f"{path.relative_to(PACKAGE.parent)} imports {sorted(found)}"
