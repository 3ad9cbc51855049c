"""Typed, frozen configuration (:mod:`mtkit.config.schema`) and one strict YAML loader
(:mod:`mtkit.config.loader`); everything either defines is importable from here."""

from mtkit.config.loader import (
    FINITE_RULE,
    Plain,
    apply_overrides,
    check_finite,
    config_from_dict,
    config_to_dict,
    load_config,
    override_section,
    parse_override,
    read_yaml,
    save_config,
)
from mtkit.config.schema import (
    BOS_ID,
    DEVICE_PATTERN,
    EOS_ID,
    LANGUAGE_CODE,
    MAX_ALPHA,
    MAX_LEN_A,
    PAD_ID,
    PRECISIONS,
    PRESETS,
    SHA256_PATTERN,
    TEMPERATURE_RANGE,
    UNK_ID,
    CleanConfig,
    Config,
    ConfigError,
    DataConfig,
    DecodeConfig,
    EvalConfig,
    ExpectedConfig,
    ModelConfig,
    PairConfig,
    Precision,
    SourceConfig,
    SpmConfig,
    TrainConfig,
    validate,
)

__all__ = [
    "BOS_ID", "DEVICE_PATTERN", "EOS_ID", "FINITE_RULE", "LANGUAGE_CODE", "MAX_ALPHA", "MAX_LEN_A", "PAD_ID",
    "PRECISIONS", "PRESETS", "SHA256_PATTERN", "TEMPERATURE_RANGE", "UNK_ID", "CleanConfig", "Config",
    "ConfigError", "DataConfig", "DecodeConfig", "EvalConfig", "ExpectedConfig", "ModelConfig", "PairConfig",
    "Plain", "Precision", "SourceConfig", "SpmConfig", "TrainConfig", "apply_overrides", "check_finite",
    "config_from_dict", "config_to_dict", "load_config", "override_section", "parse_override", "read_yaml",
    "save_config", "validate",
]
