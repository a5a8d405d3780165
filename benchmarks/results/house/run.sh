#!/usr/bin/env bash
# before (3e7172d, pre-seam) vs after (main) quick benchmark pairs, interleaved so both see the same load
set -u
PYB=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/house
mkdir -p $OUT/before $OUT/after
run() { # tree label args...
  local tree=$1 label=$2; shift 2
  (cd $tree && PYTHONPATH=$tree/src HF_HUB_OFFLINE=1 WANDB_MODE=offline $PYB "$@" --out $OUT/$label) > $OUT/$label/$(basename $3 .py)-$4.log 2>&1
}
for spec in "benchmarks/overlap.py --quick" "benchmarks/overlap.py --workload long --quick" "benchmarks/time_to_target.py --quick"; do
  for side in before after; do
    tree=/work/wt/before; [[ $side == after ]] && tree=/work/main
    echo "$(date +%T) $side $spec"
    (cd $tree && PYTHONPATH=$tree/src HF_HUB_OFFLINE=1 WANDB_MODE=offline $PYB $spec --out $OUT/$side) > "$OUT/$side/$(echo $spec | tr ' /' '__').log" 2>&1
    echo "$(date +%T) rc=$?"
  done
done
