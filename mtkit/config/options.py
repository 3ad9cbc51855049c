"""The decoding options of one call: :class:`DecodeOptions`, a frozen object with :class:`DecodeConfig`'s
fields, each None (the model's own setting) unless a flag (``--beam``), a request field or a keyword set it.
It travels from the CLI's flags and the server's request fields to the search, checked by one method
(:meth:`DecodeOptions.check`) and set on a model's settings by another (:meth:`DecodeOptions.apply`), as
CTranslate2 has one ``TranslationOptions`` and one ``validate_decoding_options``.

Its own module, not :mod:`mtkit.config.schema`: setting the options on a section goes through the loader's
strict checks (:func:`mtkit.config.loader.override_section`), and the loader imports the schema.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from mtkit.config.loader import check_finite, override_section
from mtkit.config.schema import ConfigError, DecodeConfig, check_decode
from mtkit.errors import MtkitError

# Options that only shape sampling: given without it, they would be silently ignored by search.
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "epsilon")


def flag_name(key: str) -> str:
    """The command-line flag of a decode key: ``top_p`` -> ``--top-p``."""
    return "--" + key.replace("_", "-")


class _Checked:
    """What :class:`DecodeOptions` does (its fields are made from :class:`DecodeConfig`'s below)."""

    def given(self) -> dict[str, Any]:
        """The options that are set (not None), by their config key, in the config's order."""
        return {f.name: value for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if (value := getattr(self, f.name)) is not None}

    def _as_flags(self, message: str) -> str:
        """A config error's message naming the flags that were given: ``decode.nbest`` -> ``--nbest``."""
        given = self.given()
        return re.sub(r"\bdecode\.(\w+)", lambda m: flag_name(m.group(1)) if m.group(1) in given else m.group(0),
                      message)

    def check(self) -> None:
        """Raise :class:`MtkitError`, naming the flag, for an option out of its range (the config's rules,
        :func:`mtkit.config.check_decode`; floats finite), before any model loads; ``--nbest`` above the
        model's beam is found once its settings are known (:meth:`apply`)."""
        given = self.given()
        for key, value in given.items():
            if isinstance(value, float):
                check_finite(flag_name(key), value)
        try:
            check_decode(given)
        except ConfigError as e:
            raise MtkitError(self._as_flags(str(e))) from None

    def set_on(self, decode: DecodeConfig) -> DecodeConfig:
        """``decode`` with the options set, through the config's own checks; errors name the config key
        (``decode.nbest``): the server's requests say them without the section."""
        return override_section(decode, "decode", self.given())

    def apply(self, decode: DecodeConfig) -> DecodeConfig:
        """``decode`` with the options set, through the config's own checks.

        An error about an option that was given names its flag (``--nbest: must be between 1 and --beam (4),
        got 5``), not the config key (``decode.nbest``); options that only shape sampling need sampling on,
        ``--mbr-comet-model`` needs ``--mbr comet``.
        """
        try:
            decode = self.set_on(decode)
        except MtkitError as e:
            raise MtkitError(self._as_flags(str(e))) from None
        given = self.given()
        sampling_only = [key for key in SAMPLING_ONLY if key in given]
        if sampling_only and not decode.sampling:
            raise MtkitError(f"{flag_name(sampling_only[0])} needs --sampling (it shapes sampling; search ignores it)")
        if "mbr_comet_model" in given and decode.mbr != "comet":
            raise MtkitError(f"{flag_name('mbr_comet_model')} needs --mbr comet (the model of its utility)")
        return decode

    def replace(self, **changes: Any) -> DecodeOptions:
        """A copy with ``changes`` (the object is frozen)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


# One field per DecodeConfig field, None by default: a new decode setting is an option at once.
DecodeOptions = dataclasses.make_dataclass(
    "DecodeOptions",
    [(f.name, f"{f.type} | None", dataclasses.field(default=None)) for f in dataclasses.fields(DecodeConfig)],
    bases=(_Checked,),
    frozen=True,
)
DecodeOptions.__module__ = __name__
DecodeOptions.__doc__ = """The decoding options of one call (a command's flags, a request's fields, an API call's
keywords): :class:`~mtkit.config.DecodeConfig`'s fields, each None for the model's own setting.
:meth:`check` them before a model loads, :meth:`apply` them to the model's settings."""
