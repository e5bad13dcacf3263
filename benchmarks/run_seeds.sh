#!/usr/bin/env bash
# SITE and 10-shot ICL with more seeds on all 45 FV tasks, with the settings of the committed seed-0 rows
# (results/MODEL/rows.csv: first 50 test items, 20 new tokens, every SITE default). One process per shard,
# one thread each; processes may share OUT (each row is locked while it runs). Resumable: finished rows are
# skipped. Seed 1 on every task before seed 2, so a stopped run leaves whole seeds.
#   benchmarks/run_seeds.sh smollm2-135m 0/2      # and 1/2 in a second process
#   SEEDS=0 METHODS=site benchmarks/run_seeds.sh smollm2-135m 0/2   # seed 0's SITE again: its theta (for the
#                                   head claims); its rows must equal results/MODEL/rows.csv (seed_table.py checks)
#   benchmarks/seed_table.py                     # the tables and intervals, from the rows
#   benchmarks/head_claims.py --patching         # the head-specificity claims, from the rows' theta
set -euo pipefail
MODEL=${1:-smollm2-135m}
SHARD=${2:-0/1}
SEEDS=${SEEDS:-1 2}
METHODS=${METHODS:-icl,site}
DATA=${DATA:-data/fv}
OUT=${OUT:-results/seeds/$MODEL}
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1
for seed in $SEEDS; do
  $PY -m site_lens bench --model "$MODEL" --data "$DATA" --tasks all --methods "$METHODS" --seeds "$seed" \
    --max-test 50 --out "$OUT" --shard "$SHARD"
done
