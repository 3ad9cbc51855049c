"""mtkit: a command-line toolkit for Transformer machine translation, and its Python API
(:mod:`mtkit.api`): ``mtkit.load(path).translate(lines)``, ``mtkit.evaluate(hyps, refs)``,
``mtkit.pipeline("translation", model=...)``.

Importing the package loads nothing heavy (no torch): the API's names are loaded on first use.
"""

from mtkit.version import __version__

_API = ("load", "evaluate", "detect", "pipeline", "Model", "Result", "Hypothesis", "TranslationPipeline")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from mtkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'mtkit' has no attribute {name!r}")
