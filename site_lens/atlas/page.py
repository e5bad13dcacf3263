"""One self-contained page that browses an atlas offline: no CDN, no library, the data inlined as JSON.

    write_page(atlas, "atlas.html")     # site-lens atlas view ATLAS --out atlas.html
    atlas.show()                        # the same page inline in Jupyter

The page draws on canvases with a few hundred lines of plain JavaScript:

- the task x head matrix: a row per task (grouped by category), a column per head (by layer),
  coloured by the chosen value (alpha, or another per-head ranking the atlas holds) at the
  chosen seed or the mean over seeds;
- a task (click its row, or pick it): its layer x head map, its scores, its nearest tasks;
- a head (click its column, or pick it): the tasks that put it in their top k.

``page_data`` is what the page embeds; tests compare it with the atlas.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np

VALUES = ("alpha",)  # per-head values the page can colour by, when the atlas has them
OPTIONAL_VALUES = ("cie", "attribution")
DIGITS = 4  # decimals kept in the page (a colour needs far fewer)


def page_data(atlas: Any) -> dict[str, Any]:  # an atlas.store.Atlas (not imported: store imports this module)
    """What the page embeds: tasks (grouped by category), seeds, per-head values per (task, seed), scores."""
    tasks = sorted(atlas.tasks, key=lambda t: (atlas.category(t), t))
    values = [v for v in (*VALUES, *OPTIONAL_VALUES) if v in atlas.heads.columns]
    maps: dict[str, dict[str, dict[str, list[float]]]] = {v: {} for v in values}
    h = atlas.heads.sort_values(["task", "seed", "layer", "head"])
    for (task, seed), sub in h.groupby(["task", "seed"], sort=True):
        for v in values:
            col = sub[v].to_numpy(dtype=float)
            if np.isnan(col).all():
                continue
            maps[v].setdefault(task, {})[str(int(seed))] = [None if np.isnan(x) else round(float(x), DIGITS) for x in col]
    scores: dict[str, dict[str, dict[str, float]]] = {}
    for r in atlas.scores.itertuples():
        scores.setdefault(r.task, {}).setdefault(r.method, {})[str(int(r.seed))] = round(float(r.exact_match), 4)
    strict: dict[str, dict[str, dict[str, float]]] = {}
    for r in atlas.scores.itertuples():
        strict.setdefault(r.task, {}).setdefault(r.method, {})[str(int(r.seed))] = round(float(r.strict_match), 4)
    return {
        "model": {k: atlas.model.get(k) for k in ("name", "architecture", "n_layers", "n_heads")},
        "tasks": tasks,
        "categories": {t: atlas.category(t) for t in tasks},
        "seeds": atlas.seeds,
        "values": values,
        "maps": maps,
        "prefix": scores,
        "strict": strict,
        "k": atlas.default_k(),
    }


def render(atlas: Any) -> str:
    """The page's HTML: one file, its data and script inline."""
    data = json.dumps(page_data(atlas), separators=(",", ":"))
    title = html.escape(f"SITE head atlas: {atlas.model.get('name')}")
    return TEMPLATE.replace("__TITLE__", title).replace("__DATA__", data.replace("</", "<\\/"))


def write_page(atlas: Any, path: str | Path) -> Path:
    """Write the page (through a temporary name, so a reader never sees half of it)."""
    from ..files import write_text_atomic

    path = Path(path)
    write_text_atomic(path, render(atlas))
    return path


TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:Arial,"Liberation Sans","DejaVu Sans",sans-serif;margin:16px;color:#222;font-size:14px}
h1{font-size:18px;margin:0 0 8px}h2{font-size:15px;margin:12px 0 6px}
#controls label{margin-right:14px}select{font-size:13px}
#wrap{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}
#matrix{cursor:crosshair;border:1px solid #ccc}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;text-align:right}th{text-align:left}
td:first-child{text-align:left}#note{color:#666;font-size:12px;max-width:900px}
#legend{vertical-align:middle}
</style></head><body>
<h1>__TITLE__</h1>
<div id="note"></div>
<div id="controls">
<label>seed <select id="seed"></select></label>
<label>value <select id="value"></select></label>
<label>task <select id="task"></select></label>
<label>head <select id="head"></select></label>
<canvas id="legend" width="160" height="14"></canvas> <span id="range"></span>
</div>
<div id="wrap">
<div><h2>Tasks x heads (click a row for a task, a column for a head)</h2><canvas id="matrix"></canvas></div>
<div><h2 id="task-title"></h2><canvas id="taskmap"></canvas><div id="scores"></div><div id="nearest"></div></div>
<div><h2 id="head-title"></h2><div id="headtasks"></div></div>
</div>
<script id="atlas-data" type="application/json">__DATA__</script>
<script>window.pageErrors = []; window.addEventListener("error", e => window.pageErrors.push(String(e.message)));</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("atlas-data").textContent);
const L = D.model.n_layers, H = D.model.n_heads, N = L * H;
const $ = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
const state = {seed: "mean", value: D.values[0], task: D.tasks[0], head: 0};
function opt(sel, items, labels) {
  sel.innerHTML = "";
  items.forEach((v, i) => { const o = document.createElement("option"); o.value = v; o.textContent = labels ? labels[i] : v; sel.appendChild(o); });
}
function row(task) {  // the chosen value per head, at the seed or the mean over seeds (null if absent)
  const m = (D.maps[state.value] || {})[task]; if (!m) return null;
  if (state.seed !== "mean") return m[state.seed] || null;
  const ss = Object.values(m); const out = new Array(N).fill(0);
  ss.forEach(v => v.forEach((x, i) => { out[i] += x / ss.length; })); return out;
}
function range() {
  let lo = Infinity, hi = -Infinity;
  D.tasks.forEach(t => { const r = row(t); if (r) r.forEach(x => { lo = Math.min(lo, x); hi = Math.max(hi, x); }); });
  if (state.value === "alpha") { lo = Math.min(lo, 0); hi = Math.max(hi, 1); }
  return [lo, hi];
}
function colour(x, lo, hi) {  // sequential: white to dark blue; grey where the atlas has no value
  if (x === null || x === undefined) return "#ddd";
  const f = hi > lo ? Math.max(0, Math.min(1, (x - lo) / (hi - lo))) : 0;
  const r = Math.round(247 - f * (247 - 8)), g = Math.round(251 - f * (251 - 48)), b = Math.round(255 - f * (255 - 107));
  return `rgb(${r},${g},${b})`;
}
const CW = 3, RH = 12, LEFT = 170, TOP = 18;
function drawMatrix() {
  const c = $("matrix"), [lo, hi] = range();
  c.width = LEFT + N * CW + 4; c.height = TOP + D.tasks.length * RH + 4;
  const g = c.getContext("2d"); g.clearRect(0, 0, c.width, c.height); g.font = "10px sans-serif";
  for (let l = 0; l < L; l += Math.max(1, Math.round(L / 10))) g.fillText("L" + l, LEFT + l * H * CW, 12);
  let prev = null;
  D.tasks.forEach((t, i) => {
    const y = TOP + i * RH, r = row(t);
    if (D.categories[t] !== prev) { g.fillStyle = "#999"; g.fillRect(0, y, LEFT - 4, 1); prev = D.categories[t]; }
    g.fillStyle = t === state.task ? "#c00" : "#222"; g.fillText(t, 2, y + 9);
    if (r) r.forEach((x, j) => { g.fillStyle = colour(x, lo, hi); g.fillRect(LEFT + j * CW, y, CW, RH - 1); });
  });
  for (let l = 1; l < L; l++) { g.fillStyle = "#fff"; g.fillRect(LEFT + l * H * CW - 0.5, TOP, 1, D.tasks.length * RH); }
  g.strokeStyle = "#c00"; g.strokeRect(LEFT + state.head * CW - 0.5, TOP - 2, CW + 1, D.tasks.length * RH + 2);
  const lg = $("legend").getContext("2d");
  for (let x = 0; x < 160; x++) { lg.fillStyle = colour(lo + (hi - lo) * x / 159, lo, hi); lg.fillRect(x, 0, 1, 14); }
  $("range").textContent = `${state.value} ${lo.toFixed(2)} to ${hi.toFixed(2)}`;
}
function drawTask() {
  const t = state.task, r = row(t), c = $("taskmap"), S = 14, [lo, hi] = range();
  $("task-title").textContent = `${t} (${D.categories[t]}): ${state.value} by layer (rows) and head (columns)`;
  c.width = 40 + H * S; c.height = L * S + 4; const g = c.getContext("2d"); g.clearRect(0, 0, c.width, c.height);
  g.font = "10px sans-serif";
  for (let l = 0; l < L; l++) {
    g.fillStyle = "#222"; g.fillText("L" + l, 0, l * S + 11);
    for (let h = 0; h < H; h++) { g.fillStyle = r ? colour(r[l * H + h], lo, hi) : "#eee"; g.fillRect(40 + h * S, l * S, S - 1, S - 1); }
  }
  const seeds = state.seed === "mean" ? D.seeds.map(String) : [state.seed];
  const mean = (m, key) => { const v = seeds.map(s => ((D[key][t] || {})[m] || {})[s]).filter(x => x !== undefined); return v.length ? (100 * v.reduce((a, b) => a + b, 0) / v.length).toFixed(1) : "-"; };
  const methods = Object.keys(D.prefix[t] || {}).sort();
  $("scores").innerHTML = "<h2>scores (mean over the seeds shown, %)</h2><table><tr><th>method</th><th>prefix match</th><th>strict match</th></tr>" +
    methods.map(m => `<tr><td>${esc(m)}</td><td>${mean(m, "prefix")}</td><td>${mean(m, "strict")}</td></tr>`).join("") + "</table>";
  const near = D.tasks.filter(u => u !== t).map(u => [u, jaccard(topSet(row(t)), topSet(row(u)))]).filter(x => x[1] !== null)
    .sort((a, b) => b[1] - a[1]).slice(0, 8);
  $("nearest").innerHTML = `<h2>nearest tasks (top-${D.k} Jaccard)</h2><table>` + near.map(([u, j]) => `<tr><td>${esc(u)}</td><td>${j.toFixed(2)}</td></tr>`).join("") + "</table>";
}
function topSet(r) { if (!r) return null; return new Set(r.map((x, i) => [x, i]).sort((a, b) => b[0] - a[0] || a[1] - b[1]).slice(0, D.k).map(p => p[1])); }
function jaccard(a, b) { if (!a || !b) return null; let n = 0; a.forEach(x => { if (b.has(x)) n++; }); return n / (a.size + b.size - n); }
function drawHead() {
  const h = state.head, name = `L${Math.floor(h / H)}H${h % H}`;
  $("head-title").textContent = `tasks with ${name} in their top ${D.k} heads (${state.seed === "mean" ? "mean over seeds" : "seed " + state.seed})`;
  const hits = D.tasks.map(t => [t, row(t), topSet(row(t))]).filter(x => x[2] && x[2].has(h)).map(x => [x[0], x[1][h]]).sort((a, b) => b[1] - a[1]);
  $("headtasks").innerHTML = hits.length ? "<table><tr><th>task</th><th>category</th><th>" + esc(state.value) + "</th></tr>" +
    hits.map(([t, v]) => `<tr><td>${esc(t)}</td><td>${esc(D.categories[t])}</td><td>${v === null ? "-" : v.toFixed(3)}</td></tr>`).join("") + "</table>" : "<p>no task</p>";
}
function draw() { drawMatrix(); drawTask(); drawHead(); $("task").value = state.task; $("head").value = String(state.head); }
opt($("seed"), ["mean", ...D.seeds.map(String)], ["mean over seeds", ...D.seeds.map(s => "seed " + s)]);
opt($("value"), D.values); opt($("task"), D.tasks);
opt($("head"), [...Array(N).keys()].map(String), [...Array(N).keys()].map(i => `L${Math.floor(i / H)}H${i % H}`));
$("seed").onchange = e => { state.seed = e.target.value; draw(); };
$("value").onchange = e => { state.value = e.target.value; draw(); };
$("task").onchange = e => { state.task = e.target.value; draw(); };
$("head").onchange = e => { state.head = +e.target.value; draw(); };
$("matrix").onclick = e => {
  const b = e.target.getBoundingClientRect(), x = e.clientX - b.left, y = e.clientY - b.top;
  const i = Math.floor((y - TOP) / RH), j = Math.floor((x - LEFT) / CW);
  if (x < LEFT && i >= 0 && i < D.tasks.length) state.task = D.tasks[i];
  else if (j >= 0 && j < N) { state.head = j; if (i >= 0 && i < D.tasks.length) state.task = D.tasks[i]; }
  draw();
};
$("note").textContent = `${D.model.name} (${D.model.architecture ? D.model.architecture + ", " : ""}${L} layers x ${H} heads): ${D.tasks.length} tasks, seeds ${D.seeds.join(", ")}. ` +
  "alpha = sigmoid(theta), SITE's weight on each head; prefix match: the answer line starts with the target; strict: it is the target.";
draw();
if (location.hash === "#selftest") {  // what a browser test checks: a task changes the map, a head lists its tasks
  const pick = (id, v) => { $(id).value = v; $(id).dispatchEvent(new Event("change")); };
  const before = $("taskmap").toDataURL();
  pick("task", D.tasks[D.tasks.length - 1]);
  const changed = $("taskmap").toDataURL() !== before;
  const t0 = D.tasks[0], r0 = row(t0);
  pick("task", t0); pick("head", String(r0.indexOf(Math.max(...r0))));
  const listed = [...document.querySelectorAll("#headtasks td:first-child")].map(td => td.textContent);
  document.body.setAttribute("data-selftest", JSON.stringify({errors: window.pageErrors, taskMapChanged: changed,
    headListsTask: listed.includes(t0), listed: listed}));
}
</script></body></html>
"""
