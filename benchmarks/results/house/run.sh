#!/usr/bin/env bash
# before (3e7172d, pre-seam) vs after (main) quick benchmark pairs on an idle 2-core machine (nothing
# else running). before tree: git worktree add --detach /work/wt/before 3e7172d
#   pass 1:  each benchmark, before then after            -> before/, after/
#   pass 2:  the overlap pairs again, after then before    -> before/repeat/, after/repeat/
# time_to_target.py skips runs already in its JSON: each side's JSON is removed before it runs.
set -u
PYB=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/house
run() {  # side, out dir, benchmark args...
  local side=$1 out=$2; shift 2
  local tree=/work/wt/before; [[ $side == after ]] && tree=/work/main
  mkdir -p "$out"
  echo "$(date +%T) $side $*"
  (cd $tree && PYTHONPATH=$tree/src HF_HUB_OFFLINE=1 WANDB_MODE=offline $PYB "$@" --out "$out") \
    > "$out/$(echo "$*" | tr ' /' '__').log" 2>&1
  echo "$(date +%T) rc=$?"
}
for spec in "benchmarks/overlap.py --quick" "benchmarks/overlap.py --workload long --quick"; do
  for side in before after; do run $side $OUT/$side $spec; done
done
for spec in "benchmarks/overlap.py --workload long --quick" "benchmarks/overlap.py --quick"; do
  for side in after before; do run $side $OUT/$side/repeat $spec; done
done
for side in before after; do
  rm -f $OUT/$side/time_to_target.json $OUT/$side/time_to_target.png
  run $side $OUT/$side benchmarks/time_to_target.py --quick
done
