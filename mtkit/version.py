"""mtkit's version, in a module of its own so that any module reads it without importing the package's API
(``mtkit/__init__`` re-exports it; pyproject.toml reads it here)."""

__version__ = "0.1.0"
