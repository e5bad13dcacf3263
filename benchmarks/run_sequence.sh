#!/usr/bin/env bash
# The answer-sequence objective against the first-token one: the trained methods with each, and
# 10-shot ICL, scored on prefix (the paper's) and strict match, first 50 test items, seed 0.
# SmolLM2: all 45 FV tasks. Gemma 3: 20 tasks fixed before any result was seen (every second
# task of each FV category in sorted order: 10 abstractive, the first 10 such extractive ones).
# Rows are locked, so any number of processes can share the folder:
#   benchmarks/run_sequence.sh smollm2-135m &   benchmarks/run_sequence.sh smollm2-135m &
# METHODS=site_seq,lora_seq,i2cl_seq runs only the new variants; benchmarks/sequence_table.py
# then takes the first-token rows and ICL from the 45-task bench folder (results/MODEL/).
set -euo pipefail
MODEL=${1:-smollm2-135m}
DATA=${DATA:-data/fv}
OUT=${OUT:-results/sequence/$MODEL}
PY=${PY:-.venv/bin/python}
METHODS=${METHODS:-site,site_seq,icl,lora,lora_seq,i2cl,i2cl_seq}
if [ "$MODEL" = smollm2-135m ]; then
  TASKS=all
else
  TASKS=ag_news,capitalize,capitalize_second_letter,country-capital,english-spanish,national_parks,park-country
  TASKS=$TASKS,person-sport,prev_item,singular-plural,adjective_v_verb_3,alphabetically_first_3,alphabetically_last_3
  TASKS=$TASKS,animal_v_object_3,choose_first_of_3,choose_last_of_3,choose_middle_of_3,color_v_animal_5
  TASKS=$TASKS,concept_v_object_5,conll2003_person
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
$PY -m site_lens bench --model "$MODEL" --data "$DATA" --tasks "$TASKS" --methods "$METHODS" --seeds 0 \
  --max-test 50 --out "$OUT"
