#!/usr/bin/env bash
# The benchmarks on a CUDA device with larger models: one command, every result in $OUT.
#
# Records absolute step times, MFU (against the device's measured float32 matmul rate, or
# PEAK_FLOPS if given) and peak VRAM (torch.cuda.max_memory_allocated per mode) in
# $OUT/overlap.json and $OUT/memory.json (+ PNGs), with nvidia-smi's description of the device;
# $OUT/offload.json: seconds per held backward with offload none / cpu / pinned and their ratios;
# $OUT/gpu_scale.json (+ PNG): a Qwen3-0.6B-shaped policy (MODEL) with fp32 vs bf16-true, offload
# none vs pinned and sharding zero1, each variant's max_memory_allocated against the memory plan
# of that fit (fsdp2 needs >= 2 processes: recorded as not applicable on one GPU);
# $OUT/split_backward.json (+ PNG): one learner call spanning ~21 destinations as separate calls,
# a backward per destination, or one split backward, for the toy, the 2.4M and a ~0.18B Qwen3
# (split_backward="auto" splits only up to 1M parameters, measured on CPU; this measures a GPU);
# $OUT/vllm.json: a 3-step fit of configs/gpu_vllm_example.yaml with the vLLM engine (its
# summary.json), or why it was skipped. A summary of every result is printed at the end.
#
# Usage (from anywhere): benchmarks/gpu_check.sh
#   PY=path/to/python   interpreter with this package and a CUDA build of torch (default .venv/bin/python)
#   OUT=dir             output folder (default benchmarks/results/gpu)
#   QUICK=1             pass --quick to overlap.py and memory.py, 3 steps per gpu_scale.py variant
#   HIDDEN/LAYERS/VOCAB policy size of overlap/memory/offload (default 1024 / 8 / 32000: ~0.18B
#                       parameters, full fine-tuning)
#   MAX_OPEN_GROUPS     overlap.py's bound on open groups (default 8): each open group holds two
#                       fp32 gradient sums (2 x P x 4 bytes) plus gradients held until their reward
#   MODEL               gpu_scale.py's published Qwen3 shape, randomly initialised: 0.6B (default) or 1.7B
#   VLLM_PY             interpreter with vLLM and this package (default .venv-vllm/bin/python); the
#                       vLLM section is skipped, with the reason, when `import vllm` fails there
#   VLLM_MODEL          a local Hugging Face directory for the vLLM fit (default /models/Qwen3-0.6B)
# Exits 2 with a message, before running anything, when no CUDA device is usable. A section that
# fails is reported and the others still run; the exit status is then 1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/results/gpu}
HIDDEN=${HIDDEN:-1024}
LAYERS=${LAYERS:-8}
MAX_OPEN_GROUPS=${MAX_OPEN_GROUPS:-8}
VOCAB=${VOCAB:-32000}
MODEL=${MODEL:-0.6B}
VLLM_PY=${VLLM_PY:-.venv-vllm/bin/python}
VLLM_MODEL=${VLLM_MODEL:-/models/Qwen3-0.6B}
QUICK_FLAG=()
SCALE_STEPS=(--steps 5)
if [[ "${QUICK:-0}" == 1 ]]; then
  QUICK_FLAG=(--quick)
  SCALE_STEPS=(--steps 3)
fi

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

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
FAILED=()
# run NAME CMD...: one section; a failure is recorded and the next section still runs
run() {
  local name=$1 status=0
  shift
  "$@" || status=$?
  if ((status != 0)); then
    echo "gpu_check.sh: section '$name' failed (exit status $status); continuing" >&2
    FAILED+=("$name")
  fi
}

echo "== overlap: sync / streaming / async on cuda, Qwen3 hidden $HIDDEN x $LAYERS layers, vocab $VOCAB"
run overlap "$PY" benchmarks/overlap.py --device cuda "${QUICK_FLAG[@]}" "${PEAK[@]}" \
  --hidden "$HIDDEN" --intermediate $((HIDDEN * 4)) --layers "$LAYERS" --vocab "$VOCAB" \
  --max-open-groups "$MAX_OPEN_GROUPS" --out "$OUT"

echo "== memory: accumulator bytes on cuda (offload none / cpu / pinned), sizes S M and a large L"
run memory "$PY" benchmarks/memory.py --device cuda "${QUICK_FLAG[@]}" \
  --large "$HIDDEN,$((HIDDEN * 4)),$LAYERS,$VOCAB" --max-groups 4 --out "$OUT"

echo "== offload: seconds per held backward with offload none / cpu / pinned (overlapped copies)"
run offload "$PY" benchmarks/offload.py --device cuda --hidden "$HIDDEN" --layers "$LAYERS" --vocab "$VOCAB" --out "$OUT"

echo "== gpu_scale: Qwen3-$MODEL shape, fp32 vs bf16-true, offload none vs pinned, zero1; peak vs plan"
run gpu_scale "$PY" benchmarks/gpu_scale.py --device cuda --model "$MODEL" "${SCALE_STEPS[@]}" --out "$OUT"

echo "== split_backward: one call over ~21 destinations, separate / per-destination / split, on cuda"
run split_backward "$PY" benchmarks/split_backward.py --device cuda --models toy short large "${QUICK_FLAG[@]}" --out "$OUT"

echo "== vllm: a 3-step fit of configs/gpu_vllm_example.yaml with the vLLM engine ($VLLM_PY, $VLLM_MODEL)"
VLLM_SKIP=""
if [[ ! -x "$VLLM_PY" ]]; then
  VLLM_SKIP="no interpreter at VLLM_PY=$VLLM_PY (install one: pip install -e '.[vllm]' in its own venv)"
elif ! "$VLLM_PY" -c 'import vllm' >/dev/null 2>&1; then
  VLLM_SKIP="'import vllm' fails in VLLM_PY=$VLLM_PY"
elif [[ ! -d "$VLLM_MODEL" ]]; then
  VLLM_SKIP="VLLM_MODEL=$VLLM_MODEL is not a directory (vLLM needs a local Hugging Face model with its tokenizer)"
fi
if [[ -n "$VLLM_SKIP" ]]; then
  echo "vllm: skipped: $VLLM_SKIP"
else
  rm -rf "$OUT/vllm_run"
  run vllm "$VLLM_PY" -m thundersync_lightning.cli fit --config configs/gpu_vllm_example.yaml \
    --model.pretrained_path="$VLLM_MODEL" --trainer.max_steps=3 --data.groups_per_step=4 \
    --trainer.default_root_dir="$OUT/vllm_run"
fi
"$PY" - "$OUT" "$VLLM_SKIP" "$VLLM_MODEL" <<'PYEOF'
import json, os, sys
out, skip, model = sys.argv[1:4]
summary = os.path.join(out, "vllm_run", "summary.json")
if skip:
    record = {"status": "skipped", "reason": skip}
elif os.path.exists(summary):
    record = {"status": "ran", "model": model, "summary": json.load(open(summary))}
else:
    record = {"status": "failed", "model": model, "reason": f"no {summary}: see the fit's output above"}
json.dump(record, open(os.path.join(out, "vllm.json"), "w"), indent=2)
PYEOF

echo "== summary ($OUT)"
"$PY" - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]


def load(name):
    path = os.path.join(out, f"{name}.json")
    if not os.path.exists(path):
        print(f"{name}: no {path} (the section failed or did not run)")
        return None
    return json.load(open(path))


def gib(n):
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


if (o := load("overlap")) is not None:
    print(f"overlap: streaming {o['speedup_streaming_vs_sync']:.2f}x sync, async {o['speedup_async_vs_sync']:.2f}x, "
          f"bound {o['bound_speedup']:.2f}x, efficiency {o['efficiency']:.2f}")
    for mode, r in o["modes"].items():
        print(f"  {mode:9s} step {r['median_step_s']:.3f} s  idle {r['learner_idle_fraction']:.1%}  MFU {r['mfu']:.1%}  "
              f"peak VRAM {gib(r.get('peak_vram_bytes'))}")
if (m := load("memory")) is not None:
    print(f"memory: peak VRAM {gib(m.get('peak_vram_bytes'))}; accounted/analytic "
          f"{m['summary']['accounted_over_analytic']}; strategy peak/planned {m['summary']['strategy_peak_over_planned']}")
if (f := load("offload")) is not None:
    print("offload: held backward / offload none: " + ", ".join(f"{k} {v:.3f}" for k, v in f["ratio_to_none"].items()))
if (g := load("gpu_scale")) is not None:
    print(f"gpu_scale: {g['model']} on {g['device']}")
    for name, r in g["variants"].items():
        if "skipped" in r:
            print(f"  {name:12s} skipped: {r['skipped']}")
            continue
        print(f"  {name:12s} step {r['median_step_s']:.3f} s  busy {r['median_busy_s']:.3f} s  peak "
              f"{gib(r['peak_device_bytes'])}  planned {gib(r['planned_device_bytes'])}  peak/planned "
              f"{r.get('peak_over_planned', float('nan')):.2f} (without the CUDA context row "
              f"{r.get('peak_over_planned_without_runtime', float('nan')):.2f})")
    for key, r in g["ratios"].items():
        print(f"  {key}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items() if v is not None))
    for name, why in g["not_applicable"].items():
        print(f"  {name}: not applicable: {why}")
if (b := load("split_backward")) is not None:
    for name, r in b["models"].items():
        print(f"split_backward {name} ({r['parameters'] / 1e6:.1f}M parameters, {r['destinations']} destinations): "
              f"separate/split {r['separate_over_split_wall']:.2f}x, per-destination/split {r['per_job_over_split_wall']:.2f}x")
if (v := load("vllm")) is not None:
    if v["status"] == "ran":
        s = v["summary"]
        keys = [k for k in ("steps", "reward_mean_first", "reward_mean_last", "step_seconds_median", "learner_idle_fraction",
                           "staleness_max", "engine_learner_kl_max") if k in s]
        print(f"vllm: ran {v['model']}: " + (", ".join(f"{k} {s[k]}" for k in keys) or json.dumps(s)[:400]))
    else:
        print(f"vllm: {v['status']}: {v['reason']}")
PYEOF
if ((${#FAILED[@]})); then
  echo "gpu_check.sh: failed sections: ${FAILED[*]} (results of the others in $OUT)" >&2
  exit 1
fi
echo "results in $OUT"
