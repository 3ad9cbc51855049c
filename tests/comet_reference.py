"""Run by tests/integration/test_comet_reference.py in a virtual environment with unbabel-comet (not
mtkit's): score the segments of a JSON file with unbabel-comet's own loading and predict, print the
segment scores as JSON. Usage: python comet_reference.py MODEL_FOLDER SEGMENTS.json"""

import json
import sys
from pathlib import Path

from comet import load_from_checkpoint

folder, segments = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
model = load_from_checkpoint(str(folder / "checkpoints" / "model.ckpt"))
output = model.predict(segments, batch_size=3, gpus=0, progress_bar=False)
print(json.dumps({"scores": list(map(float, output.scores)), "system_score": float(output.system_score)}))
