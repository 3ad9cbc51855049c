"""Imports go one way: cli → commands → library (data, training, search, metrics, export) → model → config."""

import ast
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


def test_the_model_knows_only_the_config():
    assert {m for m in mtkit_imports(PACKAGE / "model.py")} <= {"mtkit.config", "mtkit.config.ModelConfig"}


def test_search_sees_only_token_ids_and_the_model_protocol():
    allowed = ("mtkit.config",)
    assert all(m.startswith(allowed) for m in mtkit_imports(PACKAGE / "search.py"))


def test_config_and_errors_depend_on_nothing_above_them():
    for name in ("config.py", "errors.py", "io.py"):
        assert all(m.startswith(("mtkit.errors", "mtkit.io")) for m in mtkit_imports(PACKAGE / name)), name


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


def test_data_knows_nothing_of_training_or_models():
    for path in (PACKAGE / "data").glob("*.py"):
        bad = {m for m in mtkit_imports(path) if m.startswith(("mtkit.training", "mtkit.model", "mtkit.search"))}
        assert not bad, f"{path.name} imports {bad}"
