#!/usr/bin/env bash
# The GPU acceptance run, sized for a short slot on a bare machine (one H100/H200-class GPU, a
# preinstalled CUDA torch, lightning, transformers, torchmetrics, peft; no vllm, wandb,
# jsonargparse or network): sections in order of value, each bounded by `timeout`, the summary
# table ($OUT/summary.md) and $OUT/sections.json rewritten after every section, so a slot that
# ends early keeps everything done so far. Before the first section the planned seconds of every
# section are printed (the committed GPU run's timings, else the section's limit).
#
#   1 paper        overlap.py --workload paper: a Qwen3-1.7B-shaped learner in bf16 (AdamW, full
#                  fine-tune), coding-agent trajectories (1.5k-5.4k tokens in 4 turns), the paper's
#                  balance (sync idle 49.5%); sync / streaming / async interleaved, 3 measured steps
#                  each: speedups, bound, efficiency, MFU, peak VRAM per mode vs the plan
#                                                                            -> paper/overlap_paper.json
#                  (paper_0.6B, the Qwen3-0.6B shape, runs when the 1.7B one did not finish)
#   2 engine       gpu_engine.py: the embedded engine generating on the GPU next to the learner
#                  (Qwen3-0.6B shape), the branch tool-call task, a streaming fit of 4 steps:
#                  engine tokens/s, learner idle, staleness, a trajectory log  -> engine/
#   3 weight_sync  weight_sync.py --transport-only, 0.6B and 1.7B shapes in bf16: publish seconds
#                  of file, ipc (CUDA IPC) and nccl (skipped on one GPU)    -> weight_sync_*/
#   4 verify       thundersync_lightning.verify on a Qwen3-0.6B-shaped random model, fp32 and bf16:
#                  relative gradient difference streaming vs sync           -> verify/verify.json
#   5 memory       gpu_scale.py: the memory plan against torch.cuda.max_memory_allocated, Qwen3
#                  0.6B and 1.7B shapes, full and LoRA                      -> memory_0.6B/, memory_1.7B/
#   6 offload      offload.py: seconds per held backward, offload none / cpu / pinned, with the
#                  host buffers reserved up front and without               -> offload/offload.json
#   7 overlap, split_backward  (the earlier run's sections, if time is left)
#
# Usage: benchmarks/gpu_check.sh [--dry-run]
#   --dry-run      every section on the CPU with tiny sizes (CI: tests/benchmarks/test_gpu_check.py),
#                  into a scratch folder unless OUT is given
#   PY=python      interpreter with torch & co. (default: python3)
#   WHEELS=dir     extra wheels to install first, offline (`make gpu-wheels` writes dist/gpu-wheels;
#                  default: that folder when it exists): pip install --no-index --no-deps --target
#   OUT=dir        results (default benchmarks/results/gpu; a dry run: a new folder under $TMPDIR)
#   BUDGET_S=540   seconds for all sections (a dry run: 1800); a section's timeout never runs past it
#   ONLY='a b'     run only these sections (e.g. ONLY='weight_sync_1.7B memory_1.7B' after a slot
#                  that timed out in them); the rows of an earlier command into the same OUT are
#                  kept, sections never run are recorded as 'not selected'
# Exit status: 0 when every section that ran passed, 1 otherwise, 2 when no CUDA device is usable
# (without --dry-run).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
if (($#)); then echo "gpu_check.sh: unknown argument $1 (only --dry-run)" >&2; exit 2; fi
PY=${PY:-python3}
if ((DRY)); then  # never over the committed GPU record
  OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_dry_run.XXXXXX")}
else
  OUT=${OUT:-benchmarks/results/gpu}
fi
BUDGET_S=${BUDGET_S:-$((DRY ? 1800 : 540))}  # a dry run: tiny sizes, but 2 shared CPU cores
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
  echo "== dry run: every section on the CPU with tiny sizes, into $OUT"
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
if [[ -n $ONLY && -f $SECTIONS ]]; then  # a second command: keep the rows of the sections it does not run
  awk -F'\t' -v only=" $ONLY " 'index(only, " " $1 " ") == 0 && $2 != "not selected"' "$SECTIONS" >"$SECTIONS.kept"
  mv "$SECTIONS.kept" "$SECTIONS"
else
  : >"$SECTIONS"
fi
FAILED=0
# section NAME SECONDS CMD...: run CMD under `timeout` (never past the budget), record its status,
# rewrite the summary
section() {
  local name=$1 limit=$2 status=0 started=$SECONDS
  shift 2
  if [[ -n $ONLY && " $ONLY " != *" $name "* ]]; then
    cut -f1 "$SECTIONS" | grep -qxF "$name" || printf '%s\tnot selected\t0\tONLY=%s\n' "$name" "$ONLY" >>"$SECTIONS"
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
# checks the GPU run's flags too). GPU: seconds per section (the limit), then the arguments.
PAPER=(--workload paper --rounds 1 --steps 4 --warmup 1 --calibration-batches 1 --quick)
declare -A GPU_LIMITS=([paper]=240 [paper_0.6B]=180 [engine]=120 [weight_sync_0.6B]=40 [weight_sync_1.7B]=50
  [verify]=60 [memory_0.6B]=60 [memory_1.7B]=100 [offload]=40 [overlap]=40 [split_backward]=60)
declare -A LIMIT
for name in "${!GPU_LIMITS[@]}"; do LIMIT[$name]=${GPU_LIMITS[$name]}; done
ORDER=(paper paper_0.6B engine weight_sync_0.6B weight_sync_1.7B verify memory_0.6B memory_1.7B offload overlap
  split_backward)
if ((DRY)); then
  TINY_OVERLAP=(--device cpu --threads 1 --groups 2 --group-size 2 --hidden 64 --layers 1 --vocab 64
    --prompt-tokens 8 --token-scale 0.5 --calibration-samples 2 --calibration-reps 1)
  PAPER_ARGS=("${TINY_OVERLAP[@]}" --turns 2 --steps 2)
  ENGINE=(--device cpu --tiny --steps 2 --groups 2 --group-size 2 --max-action-tokens 8)
  WSYNC_06=(--device cpu --model tiny --repeats 1)
  WSYNC_17=(--device cpu --model tiny --repeats 1 --transports file)
  VERIFY=(--models tiny --token-scale 0.25 --accelerator cpu)
  OVERLAP=("${TINY_OVERLAP[@]}" --rounds 1 --steps 2 --warmup 1 --calibration-batches 1)
  MEMORY=("tiny:--device cpu --tiny --threads 1 --variants fp32 bf16 bf16_pinned bf16_lora bf16_lora_pinned")
  OFFLOAD=(--device cpu --hidden 64 --layers 1 --vocab 256 --trajectories 2 --tokens 16)
  SPLIT=(--device cpu --threads 1 --groups 3 --group-size 2 --repeats 1 --models toy)
  for name in "${!LIMIT[@]}"; do LIMIT[$name]=300; done
else
  PAPER_ARGS=(--device cuda --threads 4)
  ENGINE=(--device cuda --model 0.6B)
  WSYNC_06=(--device cuda --model 0.6B --dtype bf16)
  WSYNC_17=(--device cuda --model 1.7B --dtype bf16)
  VERIFY=(--models 0.6B --token-scale 2 --accelerator gpu)
  OVERLAP=(--device cuda --quick)
  # verdicts lag the learner's calls (0.05 s per trace unit): the accumulator reaches its bounds
  MEMORY=("0.6B:--device cuda --model 0.6B --steps 2 --time-scale 0.05 --variants bf16 bf16_lora"
    "1.7B:--device cuda --model 1.7B --steps 2 --time-scale 0.05 --variants bf16 bf16_lora")
  OFFLOAD=(--device cuda --hidden 1024 --layers 8 --vocab 32000 --repeats 2)
  SPLIT=(--device cuda --quick --models toy short large)
fi
# what a GPU slot will take, before it starts (dry run too): the committed GPU run's timings
limits=(); for name in "${ORDER[@]}"; do limits+=("$name=${GPU_LIMITS[$name]}"); done
"$PY" benchmarks/_gpu_summary.py --plan benchmarks/results/gpu/sections.tsv "$((DRY ? 540 : BUDGET_S))" \
  "${limits[@]}" || true

section paper "${LIMIT[paper]}" "$PY" benchmarks/overlap.py "${PAPER[@]}" "${PAPER_ARGS[@]}" --out "$OUT/paper"
if [[ $(awk -F'\t' '$1 == "paper" {s = $2} END {print s}' "$SECTIONS") == ok ]]; then
  cut -f1 "$SECTIONS" | grep -qxF paper_0.6B ||
    printf 'paper_0.6B\tnot needed\t0\tthe paper section finished\n' >>"$SECTIONS"
else  # the smaller shape, in the time that is left
  section paper_0.6B "${LIMIT[paper_0.6B]}" "$PY" benchmarks/overlap.py "${PAPER[@]}" "${PAPER_ARGS[@]}" \
    --model 0.6B --name overlap_paper --out "$OUT/paper_0.6B"
fi
section engine "${LIMIT[engine]}" "$PY" benchmarks/gpu_engine.py "${ENGINE[@]}" --out "$OUT/engine"
section weight_sync_0.6B "${LIMIT[weight_sync_0.6B]}" "$PY" benchmarks/weight_sync.py --transport-only \
  "${WSYNC_06[@]}" --out "$OUT/weight_sync_0.6B"
section weight_sync_1.7B "${LIMIT[weight_sync_1.7B]}" "$PY" benchmarks/weight_sync.py --transport-only \
  "${WSYNC_17[@]}" --out "$OUT/weight_sync_1.7B"
section verify "${LIMIT[verify]}" "$PY" benchmarks/verify_check.py --precisions 32-true bf16-true "${VERIFY[@]}" \
  --out "$OUT/verify"
for entry in "${MEMORY[@]}"; do  # name:arguments
  IFS=: read -r name args <<<"$entry"
  limit=${LIMIT[memory_$name]:-300}
  # shellcheck disable=SC2086  # the arguments are words
  section "memory_$name" "$limit" "$PY" benchmarks/gpu_scale.py $args --out "$OUT/memory_$name"
done
section offload "${LIMIT[offload]}" "$PY" benchmarks/offload.py "${OFFLOAD[@]}" --out "$OUT/offload"
section overlap "${LIMIT[overlap]}" "$PY" benchmarks/overlap.py --workload long "${OVERLAP[@]}" --out "$OUT/overlap"
section split_backward "${LIMIT[split_backward]}" "$PY" benchmarks/split_backward.py "${SPLIT[@]}" \
  --out "$OUT/split_backward"

echo "== done in $((SECONDS - START)) s; results and summary.md in $OUT"
exit $FAILED
