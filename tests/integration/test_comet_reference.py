"""mtkit's COMET against the reference implementation, unbabel-comet, on the same checkpoints: tiny models of
each supported class (tests/tiny_comet.py), scored by ``mtkit.metrics.comet`` here and by unbabel-comet's own
``load_from_checkpoint`` and ``predict`` in a virtual environment of its own (its release pins numpy < 2 and
transformers < 5, which mtkit's environment does not keep), equal to 1e-4.

The other environment is named by ``MTKIT_COMET_REFERENCE_PYTHON``; without it the test is skipped. To make one:

    python -m venv /tmp/comet-ref && /tmp/comet-ref/bin/pip install torch==2.13.0 unbabel-comet==2.2.7 'setuptools<81'
    MTKIT_COMET_REFERENCE_PYTHON=/tmp/comet-ref/bin/python pytest tests/integration/test_comet_reference.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from tiny_comet import SENTENCES, write_tiny_comet

from mtkit.metrics.comet import CometScorer

pytestmark = pytest.mark.slow  # another Python with PyTorch Lightning, started once per model

REFERENCE = os.environ.get("MTKIT_COMET_REFERENCE_PYTHON")
LONG = " ".join(SENTENCES[:4])  # beyond the tiny encoder's 40 positions: cut as unbabel-comet cuts it


@pytest.mark.skipif(not REFERENCE, reason="MTKIT_COMET_REFERENCE_PYTHON (a Python with unbabel-comet) is not set")
@pytest.mark.parametrize("kind", ["regression_metric", "referenceless_regression_metric", "unified_metric",
                                  "unified_metric mt src"])
def test_scores_equal_unbabel_comets(kind, tmp_path):
    folder = write_tiny_comet(tmp_path / "model", kind.split()[0], seed=7)
    if kind.endswith("mt src"):  # CometKiwi's shape: the translation and the source, no reference
        ckpt = torch.load(folder / "checkpoints" / "model.ckpt", weights_only=True)
        ckpt["hyper_parameters"]["input_segments"] = ["mt", "src"]
        torch.save(ckpt, folder / "checkpoints" / "model.ckpt")
    sources = [*SENTENCES[0::2], LONG, SENTENCES[0], ""]
    hypotheses = [*SENTENCES[1::2], SENTENCES[1], LONG, "Ein Mann."]
    references = [*SENTENCES[1::2][::-1], LONG, SENTENCES[3], SENTENCES[5]]
    segments = tmp_path / "segments.json"
    segments.write_text(json.dumps([{"src": s, "mt": m, "ref": r} for s, m, r in zip(sources, hypotheses, references)]))
    script = Path(__file__).parents[1] / "comet_reference.py"
    done = subprocess.run([REFERENCE, str(script), str(folder), str(segments)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    ours = CometScorer(str(folder), device="cpu").score(sources, hypotheses, references, batch_size=2, progress=False)
    assert ours == pytest.approx(theirs["scores"], abs=1e-4)
    assert sum(ours) / len(ours) == pytest.approx(theirs["system_score"], abs=1e-4)
    assert max(ours) - min(ours) > 1e-2  # the segments tell apart: equality is not that of constants
