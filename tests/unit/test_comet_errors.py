"""COMET models that cannot be had are one MtkitError line, in this process (the fast tier's twin of
tests/integration/test_comet.py's CLI cases, marked slow: each of those loads transformers in a process of
its own): a folder that is not there, a Git LFS pointer, a pickle that would run code, an encoder config that
disagrees with the checkpoint, an unknown class."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from mtkit.errors import MtkitError  # noqa: E402
from mtkit.metrics.comet import CometScorer  # noqa: E402


class Runs:
    """Pickled, it would call print when unpickled (a checkpoint that runs code)."""

    def __reduce__(self):
        return (print, ("ran code from the checkpoint",))


def broken(comet: Path, tmp_path: Path, breakage: str) -> tuple[Path, str]:
    """A copy of ``comet`` spoilt by ``breakage`` and the start of the error line it must give."""
    model = tmp_path / "model"
    shutil.copytree(comet, model)
    ckpt = model / "checkpoints" / "model.ckpt"
    if breakage == "missing":
        return tmp_path / "nowhere", f"{tmp_path / 'nowhere'}: no such directory (nor a hub name"
    if breakage == "lfs":
        ckpt.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 2\n")
        return model, f"{ckpt}: a Git LFS pointer, not the checkpoint"
    payload = torch.load(ckpt, weights_only=True)
    if breakage == "code":
        payload["callbacks"] = Runs()
        torch.save(payload, ckpt, pickle_module=pickle)
        return model, f"{ckpt}: not a readable COMET checkpoint (its pickle names '__builtin__'.'print', which no"
    if breakage == "layers":
        config = json.loads((model / "encoder" / "config.json").read_text())
        (model / "encoder" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 30}))
        hparams = (model / "hparams.yaml").read_text().replace(str(comet / "encoder"), str(model / "encoder"))
        (model / "hparams.yaml").write_text(hparams)
        payload["hyper_parameters"]["pretrained_model"] = str(model / "encoder")
        torch.save(payload, ckpt)
        return model, f"{ckpt}: the encoder config ({model / 'encoder'}) says num_hidden_layers 30, the checkpoint's"
    (model / "hparams.yaml").write_text("class_identifier: xcomet_metric\n")
    payload["hyper_parameters"]["class_identifier"] = "xcomet_metric"
    torch.save(payload, ckpt)
    return model, f"{model / 'hparams.yaml'}: class_identifier must be one of regression_metric"


@pytest.mark.parametrize("breakage", ["missing", "lfs", "code", "layers", "class"])
def test_a_comet_model_that_cannot_be_had_is_one_error_line(comet, tmp_path, breakage, capsys):
    model, expected = broken(comet, tmp_path, breakage)
    with pytest.raises(MtkitError) as caught:
        CometScorer(str(model), device="cpu")
    message = str(caught.value)
    assert message.startswith(expected) and "\n" not in message, message
    assert "ran code" not in capsys.readouterr().out
