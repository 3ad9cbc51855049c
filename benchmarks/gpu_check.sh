#!/usr/bin/env bash
# GPU check (under 8 minutes): bf16/fp16 training speed of transformer-base and -big on batches of
# the paper's size, peak memory, projected time for 100k/300k steps, and beam-4 speed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 470 "$PYTHON" benchmarks/gpu_check.py "$@"
