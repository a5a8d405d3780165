#!/usr/bin/env bash
# The overlap and memory benchmarks on a CUDA device with a larger model.
#
# Records absolute step times, MFU (against the device's measured float32 matmul rate, or
# PEAK_FLOPS if given) and peak VRAM (torch.cuda.max_memory_allocated per mode) in
# $OUT/overlap.json and $OUT/memory.json (+ PNGs), with nvidia-smi's description of the device;
# $OUT/offload.json: seconds per held backward with offload none / cpu / pinned and their ratios.
#
# Usage (from anywhere): benchmarks/gpu_check.sh
#   PY=path/to/python   interpreter with this package and a CUDA build of torch (default .venv/bin/python)
#   OUT=dir             output folder (default benchmarks/results/gpu)
#   QUICK=1             pass --quick to both scripts
#   HIDDEN/LAYERS/VOCAB policy size (default 1024 / 8 / 32000: ~0.18B parameters, full fine-tuning)
#   MAX_OPEN_GROUPS     overlap.py's bound on open groups (default 8): each open group holds two
#                       fp32 gradient sums (2 x P x 4 bytes) plus gradients held until their reward
# Exits 2 with a message, before running anything, when no CUDA device is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/results/gpu}
HIDDEN=${HIDDEN:-1024}
LAYERS=${LAYERS:-8}
MAX_OPEN_GROUPS=${MAX_OPEN_GROUPS:-8}
VOCAB=${VOCAB:-32000}
QUICK_FLAG=()
[[ "${QUICK:-0}" == 1 ]] && QUICK_FLAG=(--quick)

if [[ ! -x "$PY" ]]; then
  echo "gpu_check.sh: no interpreter at $PY; run 'make test' (or set PY=...) first" >&2
  exit 2
fi
if ! "$PY" - <<'PYEOF'
import sys
import torch
if torch.version.cuda is None:
    sys.exit(f"gpu_check.sh: torch {torch.__version__} is a CPU-only build (torch.version.cuda is None). "
             "Install a CUDA build of the same torch version into this interpreter's environment.")
if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
    sys.exit(f"gpu_check.sh: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable CUDA device "
             "(torch.cuda.is_available() is False): check the driver and CUDA_VISIBLE_DEVICES.")
print(f"CUDA device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PYEOF
then
  exit 2
fi

mkdir -p "$OUT"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.csv"
fi
export HF_HUB_OFFLINE=1
PEAK=()
[[ -n "${PEAK_FLOPS:-}" ]] && PEAK=(--peak-flops "$PEAK_FLOPS")

echo "== overlap: sync / streaming / async on cuda, Qwen3 hidden $HIDDEN x $LAYERS layers, vocab $VOCAB"
"$PY" benchmarks/overlap.py --device cuda "${QUICK_FLAG[@]}" "${PEAK[@]}" \
  --hidden "$HIDDEN" --intermediate $((HIDDEN * 4)) --layers "$LAYERS" --vocab "$VOCAB" \
  --max-open-groups "$MAX_OPEN_GROUPS" --out "$OUT"

echo "== memory: accumulator bytes on cuda (offload none / cpu / pinned), sizes S M and a large L"
"$PY" benchmarks/memory.py --device cuda "${QUICK_FLAG[@]}" \
  --large "$HIDDEN,$((HIDDEN * 4)),$LAYERS,$VOCAB" --max-groups 4 --out "$OUT"

echo "== offload: seconds per held backward with offload none / cpu / pinned (overlapped copies)"
"$PY" benchmarks/offload.py --device cuda --hidden "$HIDDEN" --layers "$LAYERS" --vocab "$VOCAB" --out "$OUT"

"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
o = json.load(open(f"{out}/overlap.json"))
print(f"overlap: streaming {o['speedup_streaming_vs_sync']:.2f}x sync, async {o['speedup_async_vs_sync']:.2f}x, "
      f"bound {o['bound_speedup']:.2f}x, efficiency {o['efficiency']:.2f}")
for mode, r in o["modes"].items():
    print(f"  {mode:9s} step {r['median_step_s']:.3f} s  idle {r['learner_idle_fraction']:.1%}  MFU {r['mfu']:.1%}  "
          f"peak VRAM {r.get('peak_vram_bytes', 0) / 2**30:.2f} GiB")
m = json.load(open(f"{out}/memory.json"))
print(f"memory: peak VRAM {m.get('peak_vram_bytes', 0) / 2**30:.2f} GiB; accounted/analytic "
      f"{m['summary']['accounted_over_analytic']}")
PYEOF
echo "results in $OUT"
