#!/usr/bin/env bash
# The atlases of both embedded models: every FV task with a committed SITE theta (seed runs), t
# recomputed by stage 1 (one thread each, the two models in parallel), their pages, and the comparison
# of the two models (benchmarks/compare_models.py --atlases atlases writes the table docs/atlas.md quotes).
#   benchmarks/build_atlases.sh            # DATA=../shared/datasets/fv to use another task folder
set -euo pipefail
DATA=${DATA:-data/fv}
SL=${SL:-.venv/bin/site-lens}
export OMP_NUM_THREADS=1
for model in smollm2-135m gemma-3-270m; do
  /usr/bin/time -f "$model: %e s wall" "$SL" atlas build --model "$model" --data "$DATA" \
    --from "results/$model,results/seeds/$model" --out "atlases/$model" > "atlases/$model.build.log" 2>&1 &
done
wait
for model in smollm2-135m gemma-3-270m; do
  tail -2 "atlases/$model.build.log"
  "$SL" atlas view "atlases/$model" --out "atlases/$model.html"
done
"$SL" atlas compare atlases/smollm2-135m atlases/gemma-3-270m | tee atlases/compare.txt
