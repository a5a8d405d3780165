#!/usr/bin/env bash
# before (3e7172d, pre-seam) vs after (main) quick benchmark pairs, interleaved so both see the same load
# before tree: git worktree add --detach /work/wt/before 3e7172d
set -u
PYB=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/house
mkdir -p $OUT/before $OUT/after
for spec in "benchmarks/overlap.py --quick" "benchmarks/overlap.py --workload long --quick" "benchmarks/time_to_target.py --quick"; do
  for side in before after; do
    tree=/work/wt/before; [[ $side == after ]] && tree=/work/main
    echo "$(date +%T) $side $spec"
    (cd $tree && PYTHONPATH=$tree/src HF_HUB_OFFLINE=1 WANDB_MODE=offline $PYB $spec --out $OUT/$side) > "$OUT/$side/$(echo $spec | tr ' /' '__').log" 2>&1
    echo "$(date +%T) rc=$?"
  done
done
