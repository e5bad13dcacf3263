#!/usr/bin/env bash
# Redraw every committed figure under figures/ from the committed results (no model is loaded):
#   scripts/make_figures.sh                 # PNG + HTML, and one plotly.min.js per folder
#   OUT=runs/figures-check scripts/make_figures.sh  # somewhere else, e.g. to compare
# Each folder's figures are drawn into a fresh folder first and replace the old ones (*.png, *.html,
# plotly.min.js) only when drawing succeeded, so it holds exactly what these commands draw. PNG export needs kaleido and a Chromium (`make chromium`); without
# one the script stops before deleting anything.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-figures}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if ! "$PY" -c 'import plotly.graph_objects as go; go.Figure().to_image(format="png", width=20, height=20)' \
  >/dev/null 2>&1; then
  echo "make_figures.sh: PNG export (kaleido + a Chromium) does not work here; try: make chromium" >&2
  exit 1
fi

draw() {  # FOLDER, then the inputs of site-lens figures: drawn into a fresh folder, swapped in when done
  local dir=$1 new="$1.new.$$"
  shift
  rm -rf "$new"
  mkdir -p "$new"
  if [ "$1" = --claims ]; then  # the claims' tables and figures (benchmarks/; no model: the patching is committed)
    "$PY" benchmarks/seed_table.py --figures "$new" >/dev/null
    for model in smollm2-135m gemma-3-270m; do
      "$PY" benchmarks/head_claims.py --model "$model" --minimal --patching --committed-only --figures "$new" >/dev/null
      "$PY" benchmarks/head_claims.py --model "$model" --patching --patch-seeds 1 --committed-only --figures "$new" >/dev/null
    done
    echo "wrote $dir"
  else
    "$PY" -m site_lens figures "$@" --out "$new" | grep '^wrote ' | sed "s#$new#$dir#g"
  fi
  mkdir -p "$dir"
  rm -f "$dir"/*.png "$dir"/*.html "$dir"/plotly.min.js
  mv "$new"/* "$dir"/
  rmdir "$new"
}

# the head-specificity study (seven FV tasks, SmolLM2) and the benchmark of both embedded models
draw "$OUT" --runs results/head_specificity/runs --bench results/smollm2-135m,results/gemma-3-270m
# the minimal-head-set study, per model
draw "$OUT/minimal" --sparse results/minimal/smollm2-135m
draw "$OUT/minimal_gemma" --sparse results/minimal/gemma-3-270m
# the claims across tasks and seeds: methods with intervals, the patching contrast, seed stability
draw "$OUT/claims" --claims
