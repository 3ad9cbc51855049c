"""A served model: a runtime engine, its language pair, name and target.

A request may ask for its own beam size, length penalty or n-best count: they travel with each call
to the engine (:meth:`mtkit.engines.engine.Engine.translate`'s ``options``), as does the target
of a multilingual model's pair. The engine is shared by every pair of a model and every decoding
thread, and never changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtkit.config import DecodeConfig
from mtkit.engines.engine import Engine

# Language names for LibreTranslate's /languages (a code without one is named by its code).
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French", "hi": "Hindi",
    "hu": "Hungarian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian",
    "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "sk": "Slovak", "sl": "Slovenian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese",
    "zh": "Chinese",
}


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code.lower(), code)


@dataclass
class ServedModel:
    """One model the server translates with.

    Args:
        name: how requests name it (``model`` in ``/v1/translate``).
        translator: the engine, with the model's default decode settings.
        src_lang, tgt_lang: language codes (the checkpoint config's ``data.src_lang`` / ``data.tgt_lang``).
        engine: ``torch`` or ``ctranslate2``.
        step: the training step of the loaded checkpoint (None when not recorded), for ``/v1/models``, which
            shows no filesystem path.
        group: the name of the multilingual model this is one pair of (a request naming it picks the
            pair by its source and target); empty for a model of one pair.
        target: the target language the engine is asked for (a multilingual model's pair's; None: the
            model's only one).
    """

    name: str
    translator: Engine
    src_lang: str
    tgt_lang: str
    engine: str = "torch"
    step: int | None = None
    group: str = ""
    target: str | None = None

    @property
    def decode(self) -> DecodeConfig:
        return self.translator.decode
