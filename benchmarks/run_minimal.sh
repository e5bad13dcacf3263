#!/usr/bin/env bash
# The minimal-head-set study on the embedded models: two processes, one core each.
# Tasks were fixed before any sparse result was seen: six abstractive and six extractive FV
# tasks on SmolLM2 (the seven of the head-specificity study, english-french, and the 3-item
# versions of the first four X_v_Y families), six of them on Gemma 3. Seed 0 runs the full
# comparison (both penalties, rankings, random sets); seeds 1 and 2 the L0 path only, for the
# seed overlap of the sparse sets. Resumable: finished (task, seed) folders are skipped.
#   benchmarks/run_minimal.sh smollm2-135m A     # and B, in parallel
set -euo pipefail
MODEL=${1:-smollm2-135m}
HALF=${2:-A}
DATA=${DATA:-data/fv}
OUT=${OUT:-results/minimal/$MODEL}
PY=${PY:-.venv/bin/python}
if [ "$MODEL" = smollm2-135m ]; then
  A="antonym alphabetically_first_3 capitalize choose_first_of_3 country-capital adjective_v_verb_3"
  B="present-past animal_v_object_3 singular-plural color_v_animal_3 english-french concept_v_object_3"
else
  A="antonym alphabetically_first_3 country-capital"
  B="present-past choose_first_of_3 adjective_v_verb_3"
fi
TASKS=$([ "$HALF" = A ] && echo "$A" || echo "$B")
export OMP_NUM_THREADS=1
for task in $TASKS; do
  $PY -m site_lens sparsify --model "$MODEL" --data "$DATA" --tasks "$task" --seeds 0 --score-valid 50 --out "$OUT"
done
for task in $TASKS; do
  $PY -m site_lens sparsify --model "$MODEL" --data "$DATA" --tasks "$task" --seeds 1,2 --penalties l0 \
    --rankings-seeds 0 --score-valid 50 --out "$OUT"
done
