#!/usr/bin/env bash
# The GPU acceptance run, sized for a short slot on a bare machine (one H100/H200-class GPU, a
# preinstalled CUDA torch, lightning, transformers, torchmetrics, peft; no vllm, wandb,
# jsonargparse or network): sections in order of value, each bounded by `timeout`, the summary
# table ($OUT/summary.md) and $OUT/sections.json rewritten after every section, so a slot that
# ends early keeps everything done so far. All sections together are sized for ~9 minutes.
#
#   1 verify       thundersync_lightning.verify on a Qwen3-0.6B-shaped random model, fp32 and bf16:
#                  relative gradient difference streaming vs sync           -> verify/verify.json
#   2 overlap      overlap.py --workload long, learner on the GPU: sync / streaming / async step
#                  times, efficiency, MFU                                    -> overlap/overlap_long.json
#   3 memory       gpu_scale.py: the memory plan against torch.cuda.max_memory_allocated, Qwen3
#                  0.6B and 1.7B shapes, full and LoRA, offload none and pinned
#                                                                            -> memory_0.6B/, memory_1.7B/
#   4 offload      offload.py: seconds per held backward, offload none / cpu / pinned (copies
#                  overlapped on a side stream)                              -> offload/offload.json
#   5 weight_sync  benchmarks/weight_sync.py --transport-only: publish seconds, ipc vs file, 0.6B
#                  shape, no vLLM (skipped, "not available", where the script is absent)
#   6 split_backward  split_backward.py: one learner call over ~21 destinations as separate calls,
#                  per-destination backwards or one split backward (toy, 2.4M, ~0.18B), if time is left
#                                                                            -> split_backward/
#
# Usage: benchmarks/gpu_check.sh [--dry-run]
#   --dry-run      every section on the CPU with tiny sizes (CI: tests/benchmarks/test_gpu_check.py)
#   PY=python      interpreter with torch & co. (default: python3)
#   WHEELS=dir     extra wheels to install first, offline (`make gpu-wheels` writes dist/gpu-wheels;
#                  default: that folder when it exists): pip install --no-index --no-deps --target
#   OUT=dir        results (default benchmarks/results/gpu)
#   BUDGET_S=540   seconds for all sections; a section's timeout never runs past it
#   ONLY='a b'     run only these sections (e.g. ONLY='weight_sync memory_1.7B' after a slot that
#                  timed out in them); the others are recorded as 'not selected'
# Exit status: 0 when every section that ran passed, 1 otherwise, 2 when no CUDA device is usable
# (without --dry-run).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
if (($#)); then echo "gpu_check.sh: unknown argument $1 (only --dry-run)" >&2; exit 2; fi
PY=${PY:-python3}
OUT=${OUT:-benchmarks/results/gpu}
BUDGET_S=${BUDGET_S:-540}
ONLY=${ONLY:-}
WHEELS=${WHEELS:-dist/gpu-wheels}
export HF_HUB_OFFLINE=1 WANDB_MODE=offline
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

SITE=""
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE="$OUT/.site"
  rm -rf "$SITE"
  echo "== installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS (offline) into $SITE"
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || exit 2
  else  # no pip: a wheel is a zip of what pip would place under --target
    for wheel in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$wheel" "$SITE" || exit 2; done
  fi
fi
# the installed wheel (when given) before the checkout's sources
export PYTHONPATH="${SITE:+$SITE:}$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if ((DRY)); then
  DEVICE=cpu
  echo "== dry run: every section on the CPU with tiny sizes"
else
  DEVICE=cuda
  "$PY" - <<'PYEOF' || exit 2
import sys
import torch
if torch.version.cuda is None or not torch.cuda.is_available():
    sys.exit(f"gpu_check.sh: torch {torch.__version__} sees no usable CUDA device (use --dry-run on a CPU)")
print(f"CUDA device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PYEOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.csv"
fi
"$PY" -c "import thundersync_lightning as t, torch, lightning; print('thundersync_lightning from', t.__file__, '| torch', torch.__version__, '| lightning', lightning.__version__)" || exit 2

START=$SECONDS
SECTIONS="$OUT/sections.tsv"
: >"$SECTIONS"
FAILED=0
# section NAME SECONDS CMD...: run CMD under `timeout` (never past the budget), record its status,
# rewrite the summary
section() {
  local name=$1 limit=$2 status=0 started=$SECONDS
  shift 2
  if [[ -n $ONLY && " $ONLY " != *" $name "* ]]; then
    printf '%s\tnot selected\t0\tONLY=%s\n' "$name" "$ONLY" >>"$SECTIONS"
    return 0
  fi
  local left=$((BUDGET_S - (SECONDS - START)))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    printf '%s\tskipped\t0\tno time left in BUDGET_S=%s\n' "$name" "$BUDGET_S" >>"$SECTIONS"
  else
    echo "== $name (at most ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" || status=$?
    local state=ok
    ((status == 124 || status == 137)) && state=timeout
    [[ $status != 0 && $state == ok ]] && state=failed
    [[ $state != ok ]] && FAILED=1
    printf '%s\t%s\t%s\texit status %s\n' "$name" "$state" "$((SECONDS - started))" "$status" >>"$SECTIONS"
  fi
  "$PY" benchmarks/_gpu_summary.py "$OUT" || true
}

# One command line per section for both runs; only sizes and the device differ (so the dry run
# checks the GPU run's flags too). (seconds, arguments) per run:
if ((DRY)); then
  VERIFY=(300 --models tiny --token-scale 0.25 --accelerator cpu)
  OVERLAP=(300 --device cpu --threads 1 --rounds 1 --steps 2 --warmup 1 --groups 2 --group-size 2 --hidden 64
    --layers 1 --vocab 64 --prompt-tokens 8 --token-scale 0.5 --calibration-samples 2 --calibration-reps 1
    --calibration-batches 1)
  MEMORY=("tiny:300:--device cpu --tiny --threads 1 --variants fp32 bf16 bf16_pinned bf16_lora bf16_lora_pinned")
  OFFLOAD=(120 --device cpu --hidden 64 --layers 1 --vocab 256 --trajectories 2 --tokens 16)
  SPLIT=(120 --device cpu --threads 1 --groups 3 --group-size 2 --repeats 1 --models toy)
else
  VERIFY=(120 --models 0.6B --token-scale 4 --accelerator gpu)
  OVERLAP=(120 --device cuda --quick)
  # a 1.7B model takes longer to build
  MEMORY=("0.6B:90:--device cuda --model 0.6B --steps 3 --variants bf16 bf16_pinned bf16_lora bf16_lora_pinned"
    "1.7B:200:--device cuda --model 1.7B --steps 3 --variants bf16 bf16_pinned bf16_lora bf16_lora_pinned")
  OFFLOAD=(45 --device cuda --hidden 1024 --layers 8 --vocab 32000)
  SPLIT=(90 --device cuda --quick --models toy short large)
fi
section verify "${VERIFY[0]}" "$PY" benchmarks/verify_check.py --precisions 32-true bf16-true "${VERIFY[@]:1}" \
  --out "$OUT/verify"
section overlap "${OVERLAP[0]}" "$PY" benchmarks/overlap.py --workload long "${OVERLAP[@]:1}" --out "$OUT/overlap"
for entry in "${MEMORY[@]}"; do  # name:seconds:arguments
  IFS=: read -r name limit args <<<"$entry"
  # shellcheck disable=SC2086  # the arguments are words
  section "memory_$name" "$limit" "$PY" benchmarks/gpu_scale.py $args --out "$OUT/memory_$name"
done
section offload "${OFFLOAD[0]}" "$PY" benchmarks/offload.py "${OFFLOAD[@]:1}" --out "$OUT/offload"

if [[ -f benchmarks/weight_sync.py ]]; then
  if ((DRY)); then  # its sizes are its own: the dry run checks that it starts and takes the flags
    section weight_sync 60 "$PY" benchmarks/weight_sync.py --transport-only --out "$OUT/weight_sync" --help
  else
    section weight_sync 60 "$PY" benchmarks/weight_sync.py --transport-only --out "$OUT/weight_sync"
  fi
else
  printf 'weight_sync\tnot available\t0\tbenchmarks/weight_sync.py is not in this checkout\n' >>"$SECTIONS"
  "$PY" benchmarks/_gpu_summary.py "$OUT" || true
fi

section split_backward "${SPLIT[0]}" "$PY" benchmarks/split_backward.py "${SPLIT[@]:1}" --out "$OUT/split_backward"

echo "== done in $((SECONDS - START)) s; results and summary.md in $OUT"
exit $FAILED
