"""The benchmark: every (task, method, seed) row, resumable, sharded, summarised.

Layout of an output folder::

    OUT/bench.json                         what the rows depend on (model, caps)
    OUT/rows/{task}/seed{s}/{method}.json  one row: scores, trainable params, timings, predictions
    OUT/rows.csv                           every row, one line each
    OUT/summary.csv, OUT/summary.md        mean over tasks per method, overall and per category

Every file is written atomically (temp file + rename), so an interrupted run
leaves finished rows whole and nothing half-written; a rerun skips rows whose
file exists with the same model and caps, and finishes the rest. A folder
with rows.csv and bench.json but no row files (row files hold predictions
and stay out of git) resumes from those two. ``--shard
I/N`` takes tasks I, I+N, I+2N ... of the sorted list (I from 0), so shards
are disjoint (inside a Slurm job array it defaults to the array's own index,
``slurm_shard``); ``merge`` summarises the rows of several output folders.

Several processes may share one folder, on one host or several hosts over a
network file system: each row is computed under a lock (``locks.Locks``,
kept in ``OUT/.locks/``) by one process only, a row whose holder died is taken
over, and bench.json and the summaries are rewritten under a folder lock from
every row on disk, so concurrent writers cannot drop each other's rows.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..config import ConfigError, EvalConfig, SiteConfig
from ..files import write_json_atomic, write_text_atomic
from ..locks import Locks, owner_tag, temp_is_orphan
from ..methods import Method, TaskContext, configured, fit_and_score, sparse_refusal
from ..models import model_identity
from ..progress import Progress, write
from ..tasks import TaskError, available_tasks, load_task  # noqa: F401 (available_tasks: also bench.available_tasks)
from ..types import Model
from .bench_report import OPTIONAL, ROW_FIELDS, csv_text, fmt, markdown, summarise
from .kept_t import ROWS_DIR, T_FILE, keep_t, kept_t, t_label, t_path  # noqa: F401 (T_FILE, t_path: also bench's)
from .row_spec import row_spec
from .sharding import resolve, shard, slurm_shard, together  # noqa: F401 (bench.resolve, bench.shard ...)

log = logging.getLogger(__name__)

SPEC_FILE = "bench.json"
LOCKS_DIR = ".locks"

# ---------------------------------------------------------------- rows on disk


def row_path(out: Path, task: str, seed: int, method: str) -> Path:
    return out / ROWS_DIR / task / f"seed{seed}" / f"{method}.json"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def remove_stale_temps(out: Path) -> int:
    """Delete temp files a killed writer left behind (never a finished row, nor a live process's temp)."""
    n = 0
    for p in out.rglob(".*.tmp"):
        if temp_is_orphan(p):
            p.unlink(missing_ok=True)
            n += 1
    return n


def lock_path(out: Path, task: str, seed: int, method: str) -> Path:
    return out / LOCKS_DIR / task / f"seed{seed}" / method


def _merge_spec(out: Path, spec: dict[str, Any], locks: Locks) -> None:
    """Write bench.json, keeping the methods, seeds and row specs other processes on this folder recorded.

    ``row_specs`` holds, per method, the spec its rows were run with; a method run with two specs
    in one folder is recorded as mixed (None), and its rows are not restored as finished.
    """
    with locks.wait(out / LOCKS_DIR / "folder"):
        old = _read_json(out / SPEC_FILE) or {}
        if old.get("model") not in (None, spec["model"]):
            raise ConfigError(
                f"{out} holds bench rows of model '{old['model']}', not '{spec['model']}': use another --out"
            )
        if (out / "rows.csv").is_file():
            restore_rows(out, old)
        for k in ("methods", "seeds"):
            spec[k] = list(dict.fromkeys([*old.get(k, []), *spec[k]]))
        specs = dict(old.get("row_specs") or {})
        for m, s in spec["row_specs"].items():
            specs[m] = s if specs.get(m, s) == s else None
        spec["row_specs"] = specs
        write_json_atomic(out / SPEC_FILE, spec)


def restore_rows(out: Path, spec: dict[str, Any]) -> int:
    """Row files again for the rows a committed rows.csv lists and no row file holds (row files hold predictions,
    kept out of git; a rows/ folder may hold only what came later: kept t, a rerun's rows), from bench.json.

    Each row gets the spec bench.json records for its method (``row_specs``; from ``config`` in a
    folder older than that), so a run with those settings skips it and the rewritten rows.csv is the
    same; a method run with two specs gets none and is run again. ``predictions`` and ``info`` are not
    in rows.csv and stay absent. All rows are parsed first and written into a temporary folder, then
    moved into place, so a bad row leaves nothing behind. To run a listed row again, remove its line from
    rows.csv with its file, or use another --out.
    """
    where = out / "rows.csv"
    with open(where, newline="") as f:
        listed = [(r.get("task"), r.get("seed"), r.get("method")) for r in csv.DictReader(f)]
    if all(_has_row_file(out, *k) for k in listed):
        return 0
    if not spec.get("model") or not isinstance(spec.get("config"), dict):
        raise ConfigError(
            f"{where} has no rows/ folder and its {SPEC_FILE} does not record the settings (a merged, copied or "
            "older summary): bench would replace it with its own rows; use another --out"
        )
    cfg = SiteConfig.from_dict(spec["config"])
    if (cfg.eval.max_test, cfg.eval.max_new_tokens) != (spec.get("max_test"), spec.get("max_new_tokens")):
        raise ConfigError(
            f"{out / SPEC_FILE}: its config and its max_test / max_new_tokens disagree: use another --out"
        )
    recorded = spec.get("row_specs")

    def spec_of(method: str) -> dict[str, Any] | None:
        if recorded is not None:
            return recorded.get(method)
        return row_spec(spec["model"], cfg, method, spec.get("dtype", "float32"))

    rows = []
    with open(where, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            try:
                rows.append({k: _from_csv(k, r.get(k, "-") if k in OPTIONAL else r[k]) for k in ROW_FIELDS})
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(f"{where}, line {i}: not a bench row ({e!r}): use another --out") from None
    rows = [r for r in rows if not row_path(out, r["task"], r["seed"], r["method"]).is_file()]
    tmp = out / f".{ROWS_DIR}.restoring"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a restore that was killed
    (tmp / ROWS_DIR).mkdir(parents=True)
    for row in rows:
        on_disk = {**row, "spec": spec_of(row["method"]), "computed_by": "rows.csv"}
        write_json_atomic(row_path(tmp, row["task"], row["seed"], row["method"]), on_disk)
    if not (out / ROWS_DIR).is_dir():
        os.replace(tmp / ROWS_DIR, out / ROWS_DIR)
    else:  # beside the row files and kept t already there
        for row in rows:
            dest = row_path(out, row["task"], row["seed"], row["method"])
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(row_path(tmp, row["task"], row["seed"], row["method"]), dest)
    shutil.rmtree(tmp)
    log.info("%s: %d rows restored from rows.csv", out, len(rows))
    return len(rows)


def _has_row_file(out: Path, task: Any, seed: Any, method: Any) -> bool:
    """Whether rows.csv's row (its text fields) has its row file (a line it cannot read counts as missing)."""
    try:
        return row_path(out, str(task), int(seed), str(method)).is_file()
    except (TypeError, ValueError):
        return False


def _from_csv(key: str, text: str) -> Any:
    if key in ("task", "category", "method"):
        return text
    if text == "-":
        return None
    return int(text) if key in ("seed", "n_trainable", "n_test") else float(text)


def is_done(path: Path, spec: dict[str, Any]) -> bool:
    """A finished row for the same model and caps."""
    row = _read_json(path)
    return row is not None and row.get("spec") == spec


def collect_rows(dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Every row under ``dirs``' rows/ folders (a later folder's row wins on a repeat), sorted."""
    rows: dict[tuple, dict[str, Any]] = {}
    for d in dirs:
        for p in sorted(Path(d).glob(f"{ROWS_DIR}/*/seed*/*.json")):
            r = _read_json(p)
            if r is None:
                log.warning("skipping unreadable row %s", p)
                continue
            rows[(r["task"], r["method"], r["seed"])] = {k: r.get(k) if k in OPTIONAL else r[k] for k in ROW_FIELDS}
    return [rows[k] for k in sorted(rows)]


# ---------------------------------------------------------------- running


def run_bench(
    model: Model,
    tasks: Sequence[str],
    methods: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    data_dir: str | Path | None = None,
    cfg: SiteConfig | None = None,
    factories: dict[str, Callable[[], Method]] | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
    locks: Locks | None = None,
    task_batch: int = 1,
) -> list[dict[str, Any]]:
    """Run every missing (task, method, seed) row no other process is running, then rewrite the folder's summary.

    ``task_batch`` > 1 fits up to that many SITE rows (task, seed) in one loop (``fit_site_many``: each
    row's theta its own fit's), before the other rows; a task's seeds go in one loop where they fit,
    sharing its prompts' prefixes.

    ``cfg`` (default: the paper's settings, the first 100 test items) sets SITE's stages, ICL's
    shots, the few-shot prompts the methods share (``cfg.embedding``) and the scoring
    (``cfg.eval``); its seed is ignored (``seeds`` gives them). ``factories`` (name -> a
    fresh method) replace ``methods.configured``.
    """
    cfg = cfg or SiteConfig(eval=EvalConfig(max_test=100))
    out = Path(out)
    locks = locks or Locks()
    ident = model_identity(model)
    dtype = str(model.cfg.dtype).removeprefix("torch.")
    spec = {"model": ident["name"], "max_test": cfg.eval.max_test, "max_new_tokens": cfg.eval.max_new_tokens}
    if task_batch < 1:
        raise ConfigError(f"task_batch must be >= 1, got {task_batch}")
    why = sparse_refusal(cfg, methods, task_batch)
    if why:
        raise ConfigError(why)
    if remove_stale_temps(out):
        log.info("removed temp files left by an interrupted run")
    _merge_spec(
        out,
        {
            **spec,
            "dtype": dtype,
            "model_identity": ident,
            "methods": list(methods),
            "seeds": list(seeds),
            "config": cfg.to_dict(),
            "row_specs": {m: row_spec(ident["name"], cfg, m, dtype) for m in methods},
        },
        locks,
    )
    with Progress(len(tasks) * len(seeds) * len(methods), "bench", unit="row") as progress:
        if task_batch > 1 and "site" in methods and factories is None:
            for pairs in together(tasks, seeds, task_batch):
                _site_together(model, pairs, out, data_dir, cfg, locks, progress, report)
        for name in tasks:
            task = None
            for seed in seeds:
                ctx = None  # shared by the methods of this (task, seed), made when one runs here
                for m in methods:
                    spec_m = row_spec(ident["name"], cfg, m, dtype)
                    path = row_path(out, name, seed, m)
                    if is_done(path, spec_m):
                        progress.skip()
                        continue
                    with locks.hold(lock_path(out, name, seed, m)) as mine:
                        if not mine:
                            log.info("%s seed %d %s: another process is on it, skipped", name, seed, m)
                            progress.skip()
                            continue
                        if is_done(path, spec_m):  # finished while this process was looking
                            progress.skip()
                            continue
                        progress.start(f"{name} seed {seed} {m}")
                        task = task or load_task(name, data_dir=data_dir)
                        ctx = ctx or TaskContext(task, seed, cfg.embedding)
                        method = factories[m]() if factories is not None else configured(m, cfg)
                        row = fit_and_score(model, method, task, seed, ctx, cfg.eval)
                        on_disk = {**row, "spec": spec_m, "computed_by": owner_tag()}  # computed_by: host.pid
                        if not locks.still_held(lock_path(out, name, seed, m)):
                            log.warning(
                                "%s seed %d %s: lock taken over by another process; result dropped", name, seed, m
                            )
                            progress.done(f"{name} seed {seed} {m}: dropped (lock taken over)")
                            continue
                        write_json_atomic(path, on_disk)
                        if ctx._mean_z is not None:  # stage 1's t, kept for an atlas (a stale one replaced)
                            label = t_label(ident["name"], dtype, cfg.embedding, task)
                            if kept_t(out, name, seed, label) is None:
                                keep_t(out, name, seed, ctx._mean_z, label)
                    progress.done(
                        f"{name} seed {seed} {m}: prefix {row['exact_match']:.2f} strict {row['strict_match']:.2f}"
                    )
                    if report is not None:
                        report(on_disk)
    return write_summary(out, locks=locks)


def _site_together(
    model: Model,
    pairs: Sequence[tuple[str, int]],
    out: Path,
    data_dir: str | Path | None,
    cfg: SiteConfig,
    locks: Locks,
    progress: Progress,
    report: Callable[[dict[str, Any]], None] | None,
) -> None:
    """SITE's missing rows of ``pairs`` (task, seed) fitted in one loop (``fit_site_many``), then scored and
    written one by one, each under its lock from before the fit (as ``run_bench`` holds it)."""
    from contextlib import ExitStack

    from ..methods import Site, fit_site_many, scored_row

    ident = model_identity(model)
    dtype = str(model.cfg.dtype).removeprefix("torch.")
    spec_m = row_spec(ident["name"], cfg, "site", dtype)
    with ExitStack() as stack:
        mine = [
            (n, seed)
            for n, seed in pairs
            if not is_done(row_path(out, n, seed, "site"), spec_m)
            and stack.enter_context(locks.hold(lock_path(out, n, seed, "site")))
            and not is_done(row_path(out, n, seed, "site"), spec_m)
        ]
        if not mine:
            return
        seeds = sorted({s for _, s in mine})
        what = f"site seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}: {len(mine)} rows in one loop"
        progress.start(f"{what}, {mine[0][0]} ... {mine[-1][0]}")
        loaded = {n: load_task(n, data_dir=data_dir) for n in dict.fromkeys(n for n, _ in mine)}  # one per task
        tasks = [loaded[n] for n, _ in mine]
        steps = cfg.selection.steps

        def said(step: int, losses: list[float]) -> None:  # a line every 50 steps: the loop runs for minutes
            if step % 50 == 0 or step == steps:
                live = [v for v in losses if not math.isnan(v)]
                write(f"{what}: step {step}/{steps}, "
                      f"mean loss {sum(live) / max(1, len(live)):.3f}", sys.stderr)  # fmt: skip

        fits = fit_site_many(model, tasks, cfg, progress=said, seeds=[s for _, s in mine])
        for (name, seed), task, fit in zip(mine, tasks, fits):
            # fit_seconds: its stage 1 and its share of the shared loop
            row = scored_row(model, Site.from_fit(fit), task, seed, cfg.eval, sum(fit.seconds.values()))
            if not locks.still_held(lock_path(out, name, seed, "site")):
                log.warning("%s seed %d site: lock taken over by another process; result dropped", name, seed)
                continue
            on_disk = {**row, "spec": spec_m, "computed_by": owner_tag()}
            write_json_atomic(row_path(out, name, seed, "site"), on_disk)
            label = t_label(ident["name"], dtype, cfg.embedding, task)
            if kept_t(out, name, seed, label) is None:
                keep_t(out, name, seed, fit.adapter.t, label)
            log.info("%s seed %d site: prefix %.2f strict %.2f", name, seed, row["exact_match"], row["strict_match"])
            if report is not None:
                report(on_disk)


# ---------------------------------------------------------------- summary files


def write_summary(out: Path, sources: Sequence[Path] | None = None, locks: Locks | None = None) -> list[dict[str, Any]]:
    """rows.csv, summary.csv and summary.md in ``out`` from the rows of ``sources`` (default ``out``).

    Written under the folder lock from the rows on disk at that moment: the last writer has every row.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with (locks or Locks()).wait(out / LOCKS_DIR / "folder"):
        return _write_summary(out, sources)


def _write_summary(out: Path, sources: Sequence[Path] | None) -> list[dict[str, Any]]:
    rows = collect_rows(sources or [out])
    summary = summarise(rows)
    spec = _read_json(out / SPEC_FILE) or next(
        (_read_json(Path(s) / SPEC_FILE) for s in sources or [] if _read_json(Path(s) / SPEC_FILE)), None
    )
    title = f"site-lens bench: {spec['model']}, max_test {spec['max_test']}" if spec else "site-lens bench"
    write_text_atomic(out / "rows.csv", csv_text([{k: fmt(r[k]) for k in ROW_FIELDS} for r in rows]))
    write_text_atomic(out / "summary.csv", csv_text([{k: fmt(v) for k, v in s.items()} for s in summary]))
    write_text_atomic(out / "summary.md", markdown(rows, summary, title))
    return rows


def merge(sources: Sequence[Path], out: Path) -> list[dict[str, Any]]:
    """Summarise the rows of several (shard) output folders into ``out``."""
    missing = [str(s) for s in sources if not (Path(s) / ROWS_DIR).is_dir()]
    if missing:
        raise TaskError(f"no bench rows under {', '.join(missing)}")
    return write_summary(out, [Path(s) for s in sources])
