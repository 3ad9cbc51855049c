"""mtkit.model_spec, the table of the Transformer's tensor names and shapes that checkpoints are checked
against without torch, equals the real model's state_dict for every option that changes a name or a shape."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mtkit.config import config_from_dict
from mtkit.model import Transformer
from mtkit.model_spec import parameter_shapes

BASE = {"d_model": 8, "h": 2, "d_ff": 12, "encoder_layers": 2, "decoder_layers": 1, "max_positions": 16}
OPTIONS = {
    "the paper's": {},
    "pre-norm": {"norm": "pre"},
    "learned positions": {"positions": "learned"},
    "output bias": {"output_bias": True, "share_embeddings": "none"},
    "decoder sharing": {"share_embeddings": "decoder"},
    "no sharing, pre-norm, learned": {"share_embeddings": "none", "norm": "pre", "positions": "learned"},
    "swish, concatenated sinusoids, unscaled": {"activation": "swish", "sinusoid_layout": "concatenated",
                                                "scale_embedding": False},
    "deeper decoder": {"encoder_layers": 1, "decoder_layers": 3, "d_ff": 20},
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_table_is_the_state_dict(name):
    model_cfg = config_from_dict({"model": {**BASE, **OPTIONS[name]}}).model
    shared = model_cfg.share_embeddings == "all"
    src, tgt = (11, 11) if shared else (11, 13)
    real = {k: tuple(v.shape) for k, v in Transformer(model_cfg, src, tgt).state_dict().items()}
    table = parameter_shapes(model_cfg, src, tgt)
    assert table == real
    assert list(table) == list(real)  # the same names in the same order


def test_the_table_needs_no_torch():
    code = ("import sys\nfrom mtkit.config import ModelConfig\nfrom mtkit.model_spec import parameter_shapes\n"
            "assert len(parameter_shapes(ModelConfig(d_model=65536), 32000, 32000)) > 100\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
