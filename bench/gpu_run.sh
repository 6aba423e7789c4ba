#!/usr/bin/env bash
# The GPU checks of issue 4, as one prepared run on a lent GPU machine (device tool; no Ray, no vLLM there, so the
# learner-stage selector bench runs its trainer in process). Writes logs and JSON under $OUT (default ./gpu_out).
# Usage there: bash bench/gpu_run.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # earl_core is not installed there
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$OUT/gpu.txt"
# Selector vs every static layout of one trainer worker, context 1K -> 32K, Qwen2.5-0.5B's shape (random weights).
(cd bench && timeout 480 python3 selector_bench.py --in-process --workers 1 --preset qwen2.5-0.5b-shape \
  --contexts 1024,2048,4096,8192,16384,32768 --repeat 1 --games 8 --micro-batches 1,2,4 \
  --profile-contexts 1024,8192,32768 --budget-gib 0 --out "$OUT/gpu_selector_bench.json") 2>&1 \
  | grep -v "Loading weights" | tee "$OUT/gpu_selector_bench.log"
# The GPU-marked tests that need no vLLM (the machine has none).
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/core/test_gpu.py -k "not vllm" 2>&1 | tail -15 \
  | tee "$OUT/gpu_tests.log"
