#!/usr/bin/env bash
# Every benchmark's --quick run into one directory, the input of benchmarks/quick_compare.py.
# Usage: benchmarks/quick_all.sh OUT_DIR [TEACHER_CKPT]
#   run from the root of the tree to measure (PYTHON: the interpreter, default .venv/bin/python);
#   TEACHER_CKPT: opd's teacher, given so that two trees are compared with the same teacher (each
#   tree otherwise trains its own 40-step teacher, and those differ run to run).
set -euo pipefail
out=$1
teacher=${2:-}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
for name in overlap sample_efficiency memory core_overhead boundary_cut dynamic_sampling learner_calls \
    micro_batches opd split_backward time_to_target token_cap; do
  extra=()
  if [[ $name == opd && -n $teacher ]]; then extra=(--teacher "$teacher"); fi
  start=$(date +%s)
  "$py" "benchmarks/$name.py" --quick --out "$out" "${extra[@]}" > "$out/$name.log" 2>&1
  echo "$name: $(( $(date +%s) - start )) s" | tee -a "$out/durations.txt"
done
