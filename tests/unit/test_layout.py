"""Imports go one way: cli → commands → library (training, export, translate, metrics ...) → runtime →
decoding, data → model → kernels → config; inference never imports training.

The runtime's torch engine runs search and loads vocabularies, so decoding and data sit below it;
decoding knows no files, no vocabularies, no engine.
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mtkit"


def mtkit_imports(path: Path) -> set[str]:
    """The mtkit modules a file imports (at any level, lazily or not)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mtkit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mtkit"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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


# Top-level modules and packages, layer by layer from the top: each imports only from its own layer
# or those below it (mtkit itself, for __version__, sits at the bottom).
LAYERS = [
    {"mtkit.cli", "mtkit.__main__"},
    {"mtkit.commands"},
    {"mtkit.serve", "mtkit.training"},  # the target order (#61): they load models through mtkit.api
    {"mtkit.api"},
    {"mtkit.export", "mtkit.visualize", "mtkit.host_memory", "mtkit.importers"},
    {"mtkit.text"},
    {"mtkit.engines"},
    {"mtkit.decoding", "mtkit.data", "mtkit.metrics"},
    {"mtkit.model", "mtkit.model_spec"},
    {"mtkit.kernels"},
    {"mtkit.config", "mtkit.errors", "mtkit.io", "mtkit.hub", "mtkit.checkpoint_file", "mtkit.logs", "mtkit"},
]
INFERENCE = ("mtkit.engines", "mtkit.decoding", "mtkit.export",
             "mtkit.commands.translate", "mtkit.commands.evaluate", "mtkit.commands.export",
             "mtkit.commands.score", "mtkit.serve", "mtkit.commands.serve")


def top_level(module: str) -> str:
    """``mtkit.training.trainer`` -> ``mtkit.training``; ``mtkit`` stays ``mtkit``."""
    return ".".join(module.split(".")[:2])


def module_file(module: str) -> Path | None:
    """The file of an mtkit module (None for a name imported from a module, e.g. ``mtkit.config.PAD_ID``)."""
    base = PACKAGE.parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


# The package's lazy re-export of the API (PEP 562 ``__getattr__``: ``mtkit.load`` imports mtkit.api on
# first use, never when mtkit is imported): the one edge that goes up, by design.
LAZY_REEXPORTS = {("mtkit", "mtkit.api")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the mtkit modules it imports (with the packages above them, which Python runs first)."""
    graph = {}
    for path in files():
        found = set()
        for m in mtkit_imports(path):
            if (module_name(path), m) in LAZY_REEXPORTS:
                continue
            parts = m.split(".")
            found |= {".".join(parts[:k]) for k in range(1, len(parts) + 1) if module_file(".".join(parts[:k]))}
        graph[module_name(path)] = found
    return graph


def layer_of(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if top_level(module) in layer:
            return i
    raise AssertionError(f"{module}: not in test_layout.LAYERS; add it to its layer")


def test_imports_go_down_the_layers():
    for module, imported in import_graph().items():
        for m in imported:
            assert layer_of(m) >= layer_of(module), f"{module} imports {m}, a layer above it"


def test_no_cycles_between_top_level_packages():
    edges: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
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


def test_inference_never_imports_training():
    graph = import_graph()
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
            "mtkit.engines.ctranslate2_engine, mtkit.engines.checkpoint\n"
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
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = {node.func.id for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ENGINE_CLASSES}
        assert not calls, f"{path.relative_to(PACKAGE.parent)} builds {sorted(calls)} itself; use mtkit.engines.factory"


def test_command_functions_take_few_parameters():
    """Commands are glue: a command function takes a few arguments and one typed options object (ServeOptions,
    TranslateOptions, EvaluateOptions, DataFlags ...), never the CLI's flags one by one."""
    for path in sorted((PACKAGE / "commands").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                count = len(node.args.posonlyargs) + len(node.args.args) + len(node.args.kwonlyargs)
                assert count <= 8, f"commands/{path.name}: {node.name} takes {count} parameters"


def test_checkpoints_are_written_and_read_in_one_module():
    """mtkit.engines.checkpoint alone writes (torch.save) and reads (torch.load) mtkit checkpoints; training,
    average, the importers and the exporters go through it. (The Marian importer reads a Hugging Face
    pytorch_model.bin and COMET a Lightning checkpoint, not checkpoints of ours.)"""
    allowed = {PACKAGE / "engines" / "checkpoint.py": {"save", "load"}, PACKAGE / "importers" / "marian.py": {"load"},
               PACKAGE / "metrics" / "comet.py": {"load"}}
    for path in files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr in ("save", "load")}
        extra = used - allowed.get(path, set())
        assert not extra, f"{path.relative_to(PACKAGE.parent)} calls torch {sorted(extra)}: use runtime.checkpoint"


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
        found = {m for m in mtkit_imports(path) if m.startswith(("mtkit.engines.factory", "mtkit.engines.checkpoint"))}
        assert not found, f"{path.relative_to(PACKAGE.parent)} imports {sorted(found)}"
