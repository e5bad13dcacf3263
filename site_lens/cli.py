"""The ``site-lens`` command: thin subcommands over the API.

    site-lens run --model smollm2-135m --task antonym [--data DIR] [--out DIR] ...
    site-lens demo [--out DIR]
    site-lens tasks [--data DIR]

Errors in user input (bad task file, unknown model or task, too few examples,
prompt too long, mismatched adapter) print one line, ``site-lens: error: ...``,
and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _user_errors() -> tuple[type[BaseException], ...]:
    from .config import ConfigError
    from .io import AdapterError
    from .models import ModelError
    from .tasks import TaskError
    from .tokens import PromptTooLongError

    return (ConfigError, PromptTooLongError, AdapterError, ModelError, TaskError)


def check_writable(out: Path) -> None:
    """Fail before any work if the output folder cannot be written."""
    from .tasks import TaskError

    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-test")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise TaskError(f"output folder {out} is not writable ({e.strerror or e})") from None


def _progress_bar(total: int, desc: str) -> tuple[Callable[[int, float], None], Callable[[], None]]:
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, leave=False, file=sys.stderr, disable=not sys.stderr.isatty() and "CI" in os.environ)

    def update(step: int, loss: float) -> None:
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")

    return update, bar.close


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'task':<22} {'method':<10} {'first-tok':>9} {'exact':>7} {'strict':>7} {'ms/query':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['task']:<22} {r['method']:<10} {r['first_token_acc']:>9.3f} {r['exact_match']:>7.3f} "
            f"{r['strict_match']:>7.3f} {r['ms_per_query']:>9.1f}"
        )
    return "\n".join(lines)


def _site_config(args: argparse.Namespace):
    from .config import site_config_from_args

    return site_config_from_args(args)


def _check_backend(model, cfg) -> None:
    """A backend asked for that the model cannot run fails now, not after stage 1."""
    from .backend import backend_for

    if cfg.selection.fast and cfg.selection.backend != "auto":
        backend_for(model, cfg.selection.backend)


def run_one(model, task, cfg, out: Path, load_s: float | None = None) -> dict[str, Any]:
    """Stages 1-3 and the baselines on one task; then write OUT/adapter/ and OUT/results.json."""
    from .io import save_adapter, write_json_atomic
    from .pipeline import run_task

    _check_backend(model, cfg)
    update, close = _progress_bar(cfg.selection.steps, f"{task.name}: training alpha")
    try:
        results, adapter = run_task(model, task, cfg, progress=update)
    finally:
        close()
    if load_s is not None:
        results["seconds"]["model_load"] = load_s
    # written only once everything succeeded; each write is atomic
    if adapter is not None:
        save_adapter(adapter, out / "adapter")
    write_json_atomic(out / "results.json", results)
    return results


def _rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"task": res["task"], "method": m, **res[m]} for m in ("zero_shot", "icl", "site") if m in res]


def cmd_run(args: argparse.Namespace) -> int:
    from .models import load_model
    from .tasks import load_task

    cfg = _site_config(args)
    task = load_task(args.task, data_dir=args.data)  # bad task input fails before the model loads
    from .tasks import check_enough

    check_enough(task.train, cfg.embedding.n_shots + 1, f"task '{task.name}' split 'train' ({cfg.embedding.n_shots} shots + 1 query)")
    from .models import resolve_model_name

    resolve_model_name(args.model)  # an unknown model fails before anything is written
    out = Path(args.out) if args.out else Path("runs") / args.model / task.name
    check_writable(out)
    t0 = time.perf_counter()
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    res = run_one(model, task, cfg, out, time.perf_counter() - t0)
    print(_table(_rows(res)))
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res["seconds"].items()))
    print(f"wrote {out / 'results.json'} and {out / 'adapter'}/")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """SITE on every built-in task; prints the table and writes an alpha heatmap."""
    from .models import load_model
    from .tasks import builtin_tasks, check_enough, load_task

    cfg = _site_config(args)
    tasks = [load_task(name) for name in args.tasks or builtin_tasks()]  # bad input fails before any work
    for task in tasks:
        check_enough(task.train, cfg.embedding.n_shots + 1, f"task '{task.name}' split 'train' ({cfg.embedding.n_shots} shots + 1 query)")
    out = Path(args.out)
    check_writable(out)
    check_writable(Path(args.figures))
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    rows, alphas = [], {}
    for task in tasks:
        name = task.name
        res = run_one(model, task, cfg, out / name)
        rows += _rows(res)
        from .io import load_adapter

        alphas[name] = load_adapter(out / name / "adapter").alpha
        print(_table(_rows(res)).split("\n", 2)[-1], flush=True)
    print()
    print(_table(rows))
    try:
        from .plots import alpha_heatmap, save_figure

        fig_dir = Path(args.figures)
        for name, a in alphas.items():
            written = save_figure(alpha_heatmap(a, title=f"SITE alpha, {args.model}, {name}"), fig_dir / f"demo_alpha_{name}")
            print("wrote " + ", ".join(str(w) for w in written))
    except ImportError as e:  # plots module missing: the table still stands
        print(f"(no figure: {e})")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from .tasks import TaskError, builtin_tasks, load_task

    if args.data and not Path(args.data).is_dir():
        raise TaskError(f"{args.data}: data folder not found")
    names = sorted(p.name for p in Path(args.data).iterdir() if p.is_dir()) if args.data else builtin_tasks()
    for n in names:
        t = load_task(n, data_dir=args.data)
        print(f"{n:<28} train {len(t.train):>5}  valid {len(t.valid):>4}  test {len(t.test):>5}  case-sensitive {t.case_sensitive}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Every (task, method, seed) row, resumable; then OUT/summary.{csv,md}."""
    from . import bench
    from .methods import METHODS
    from .models import load_model

    _site_config(args)  # a bad config value fails before the model loads
    if args.seeds < 1:
        from .config import ConfigError

        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    methods = bench.resolve(args.methods, list(METHODS), "method")
    tasks = bench.shard(bench.resolve(args.tasks, bench.available_tasks(args.data), "task"), args.shard)
    out = Path(args.out) if args.out else Path("results") / args.model
    check_writable(out)
    model = load_model(args.model, device=args.device, dtype=args.dtype, n_devices=args.n_devices)

    def report(r: dict[str, Any]) -> None:
        print(f"{r['task']:<26} {r['method']:<10} first-tok {r['first_token_acc']:.3f} exact {r['exact_match']:.3f} "
              f"params {r['n_trainable']:>9,} fit {r['fit_seconds']:7.1f}s {r['ms_per_query']:7.1f} ms/q", flush=True)

    cfg = _site_config(args)
    if "site" in methods:
        _check_backend(model, cfg)
    seeds = range(cfg.seed, cfg.seed + args.seeds)
    bench.run_bench(model, tasks, methods, seeds, out, args.data, cfg=cfg, report=report)
    print((out / "summary.md").read_text())
    print(f"wrote {out / 'summary.csv'}, {out / 'summary.md'}, {out / 'rows.csv'}")
    return 0


def cmd_bench_merge(args: argparse.Namespace) -> int:
    """Summarise the rows of several bench output folders (e.g. shards) into one."""
    from . import bench

    out = Path(args.out or args.dirs[0])
    check_writable(out)
    bench.merge([Path(d) for d in args.dirs], out)
    print((out / "summary.md").read_text())
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    """Figures (HTML + PNG) from run folders; with --analyse, first patching, CIE and transfer (loads the model)."""
    from .report import TRANSFER_FILE, find_runs, summarise, write_figures

    runs = find_runs(args.runs)
    if not runs:
        from .tasks import TaskError

        raise TaskError(f"no run folders (results.json + adapter/) under {args.runs}")
    out = Path(args.out)
    check_writable(out)
    if args.analyse:
        from .models import load_model

        model = load_model(args.model, device=args.device, dtype=args.dtype)
        from .report import analyse_runs

        analyse_runs(model, runs, args.data, max_items=args.max_test, cie_prompts=args.cie_prompts, draws=args.draws)
    import pandas as pd

    transfer_path = Path(args.runs) / TRANSFER_FILE
    transfer = pd.read_csv(transfer_path, index_col=0) if transfer_path.is_file() else None
    written = write_figures(runs, out, transfer)
    for name, df in summarise(runs).items():
        print(f"\n[{name}]")
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        if args.tables:
            Path(args.tables).mkdir(parents=True, exist_ok=True)
            df.to_csv(Path(args.tables) / f"{name}.csv", index=False)
    print(f"\nwrote {len(written)} files under {out}/:")
    for w in written:
        print(f"  {w}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``site-lens`` argument parser, one subparser per command."""
    parser = argparse.ArgumentParser(prog="site-lens", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), gemma-3-270m, or a TransformerLens name")
        p.add_argument("--device", default=None, help="cpu (default), cuda, ...")
        p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16")

    def common(p: argparse.ArgumentParser) -> None:
        from .config import add_site_arguments

        model_args(p)
        p.add_argument("--data", default=None, help="folder of tasks in the FV layout (task folders or .json lists)")
        add_site_arguments(p)

    p_run = sub.add_parser("run", help="stages 1-3 on one task, plus zero-shot and ICL; writes OUT/results.json and OUT/adapter/")
    common(p_run)
    p_run.add_argument("--task", required=True, help="a built-in task name, or a task under --data, or a path")
    p_run.add_argument("--out", default=None, help="output folder (default runs/MODEL/TASK)")
    p_run.set_defaults(func=cmd_run)

    p_demo = sub.add_parser("demo", help="SITE on the built-in tasks: table + alpha heatmaps")
    common(p_demo)
    p_demo.add_argument("--tasks", nargs="*", default=None, help="built-in task names (default: all)")
    p_demo.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p_demo.add_argument("--figures", default="figures", help="folder for the alpha heatmaps (default figures/)")
    p_demo.set_defaults(func=cmd_demo)

    p_tasks = sub.add_parser("tasks", help="list built-in tasks, or the tasks under --data")
    p_tasks.add_argument("--data", default=None)
    p_tasks.set_defaults(func=cmd_tasks)

    p_bench = sub.add_parser("bench", help="benchmark methods x tasks x seeds; resumable; writes OUT/rows/ and OUT/summary.{csv,md}")
    common(p_bench)
    p_bench.set_defaults(**{"EvalConfig.max_test": 100})  # the benchmark scores 100 items by default
    next(a for a in p_bench._actions if a.dest == "EvalConfig.max_test").help = "score only the first N test items (default: 100)"
    p_bench.add_argument("--tasks", default="all", help="'all' or a comma list of task names")
    p_bench.add_argument("--methods", default="all", help="'all' or a comma list: zero_shot,icl,site,fv,tv,i2cl,mtv,lora,ia3")
    p_bench.add_argument("--seeds", type=int, default=1, help="number of seeds: --seed, --seed + 1, ... (default 1)")
    p_bench.add_argument("--out", default=None, help="output folder (default results/MODEL)")
    p_bench.add_argument("--shard", default=None, help="I/N: run tasks I, I+N, ... of the sorted list (I from 0)")
    p_bench.add_argument("--n-devices", type=int, default=1, help="devices to split the model over (TransformerLens names only)")
    p_bench.set_defaults(func=cmd_bench)

    p_merge = sub.add_parser("bench-merge", help="merge bench output folders (shards) into one summary")
    p_merge.add_argument("dirs", nargs="+", help="bench output folders")
    p_merge.add_argument("--out", default=None, help="where to write the summary (default: the first folder)")
    p_merge.set_defaults(func=cmd_bench_merge)

    p_fig = sub.add_parser("figures", help="head-specificity figures (HTML + PNG) and tables from run folders under --runs")
    p_fig.add_argument("--runs", required=True, help="folder searched recursively for results.json + adapter/")
    p_fig.add_argument("--out", default="figures", help="folder for the figures (default figures/)")
    p_fig.add_argument("--analyse", action="store_true", help="first compute patching, CIE and transfer (loads --model)")
    p_fig.add_argument("--model", default="smollm2-135m")
    p_fig.add_argument("--device", default=None)
    p_fig.add_argument("--dtype", default="float32")
    p_fig.add_argument("--data", default=None, help="the tasks' data folder (FV layout)")
    p_fig.add_argument("--max-test", type=int, default=50, help="test items for patching and transfer")
    p_fig.add_argument("--cie-prompts", type=int, default=25, help="shuffled-label prompts for the CIE")
    p_fig.add_argument("--draws", type=int, default=5, help="random head sets per k")
    p_fig.add_argument("--tables", default=None, help="also write the summary tables as CSV into this folder")
    p_fig.set_defaults(func=cmd_figures)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except _user_errors() as e:
        print(f"site-lens: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("site-lens: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
