"""The analysis subcommands: ``sparsify`` (minimal head sets), ``analyse`` (patching, CIE, transfer over
run folders) and ``figures`` (figures and tables from run, bench and sparsify folders, no model).

As in ``commands``, each ``cmd_*`` takes the parsed arguments and returns an exit status; user
errors are the package's one-line error types.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .commands import check_writable, require_data_for_fv


def cmd_sparsify(args: argparse.Namespace) -> int:
    """Minimal head sets per (task, seed), resumable; then OUT/summary.{csv,md} (and OUT/shared/ with --shared)."""
    import dataclasses

    from ..config import ConfigError, MinimalConfig
    from .args import from_args, site_config_from_args

    cfg, study = site_config_from_args(args), from_args(MinimalConfig, args)  # a bad value fails before torch loads
    from ..experiments import bench
    from ..experiments.minimal_report import write_summaries
    from ..experiments.sweep import add_attribution, is_done, minimal_sets, settings_differ, write_minimal
    from ..models import load_model
    from ..progress import Progress, write
    from ..tasks import TaskError, load_task

    if cfg.selection.objective != "first_token":
        raise ConfigError("sparsify trains on the first answer token only (--objective first_token)")
    if cfg.sparsity is not None:
        raise ConfigError("sparsify sweeps its own penalties (--penalties, --weights-l0, --weights-l1): drop the --sparse-* flags")
    require_data_for_fv(args.tasks, args.data)
    tasks = bench.resolve(args.tasks, bench.available_tasks(args.data), "task")
    seeds = args.seeds or [cfg.seed]
    weights = study.weights()
    out = Path(args.out)
    check_writable(out)
    model = load_model(args.model, device=args.device, dtype=args.dtype, engine=getattr(args, "engine", None))
    with Progress(len(tasks) * len(seeds), "sparsify", unit="task seed") as progress:
        for name in tasks:
            task = load_task(name, args.data)
            for seed in seeds:
                folder = out / name / f"seed{seed}"
                settings = dict(
                    weights=weights,
                    path_steps=study.path_steps,
                    ks=study.ks,
                    draws=study.draws,
                    rankings=args.rankings_seeds is None or seed in args.rankings_seeds,
                    max_valid=study.score_valid,
                    max_test=cfg.eval.max_test,
                )
                if is_done(folder) and not args.redo:
                    recorded = {**settings, "weights": {k: list(v) for k, v in weights.items()}, "ks": list(study.ks)}
                    recorded["config"] = dataclasses.replace(cfg, seed=seed).to_dict()
                    differ = settings_differ(folder, recorded)
                    if differ:
                        raise TaskError(f"{folder} was made with other {', '.join(differ)}; use --redo or another --out")
                    added = add_attribution(model, task, folder) if settings["rankings"] else None
                    more = f"; attribution's ranking added ({added:.1f} s)" if added is not None else ""
                    progress.skip()
                    write(f"{name} seed {seed}: done already ({folder}){more}")
                    continue
                progress.start(f"{name} seed {seed}")
                t0 = time.perf_counter()
                result = minimal_sets(model, task, seed, cfg=cfg, **settings)
                write_minimal(result, folder)
                sizes = ", ".join(f"{s['penalty']} w={s['weight']:g}: {s['n_mask']}" for s in result.info["sparse"])
                progress.done(f"{name} seed {seed}: minimal sets written")
                write(f"{name} seed {seed}: {time.perf_counter() - t0:.0f} s; heads in the masks: {sizes}")
    if study.shared:
        from ..experiments.sweep import run_shared

        run_shared(model, out, [load_task(n, args.data) for n in tasks], seeds[0], cfg)
        print(f"wrote {out / 'shared'}")
    print(write_summaries(out))
    print(f"wrote {out}/summary.md and its CSV tables")
    return 0


def _find_runs(root: str):
    from pathlib import Path

    from ..experiments.report import find_runs
    from ..tasks import TaskError

    if not Path(root).is_dir():
        raise TaskError(f"{root}: no such folder (give a run folder, a folder of runs or an adapter folder)")
    runs = find_runs(root)
    if not runs:
        raise TaskError(
            f"no run folders (results.json + adapter/) under {root}, and it is no adapter folder "
            "(cfg.json + adapter.safetensors)"
        )
    return runs


def cmd_analyse(args: argparse.Namespace) -> int:
    """Patching, CIE and transfer for run folders (loads the model); results go next to the runs."""
    from ..config import AnalyseConfig
    from .args import from_args

    todo = from_args(AnalyseConfig, args)  # a bad value fails before torch is imported or the runs are read
    from ..experiments.report import analyse_runs
    from ..models import load_model
    from ..tasks import TaskError

    runs = _find_runs(args.runs)
    for r in runs:
        check_writable(r.path)
    name = args.model
    if name is None:  # the model the adapters were trained on
        names = sorted({str(r.adapter.model.get("name")) for r in runs})
        if "None" in names:
            raise TaskError(f"an adapter under {args.runs} records no model name: choose the model with --model")
        if len(names) != 1:
            raise TaskError(f"the runs under {args.runs} were trained on {', '.join(names)}: choose one with --model")
        name = names[0]
    model = load_model(name, device=args.device, dtype=args.dtype, engine=getattr(args, "engine", None))
    max_items = todo.max_test if todo.max_test is not None else 10**9
    analyse_runs(
        model, runs, args.data, max_items=max_items, cie_prompts=todo.cie_prompts, draws=todo.draws, redo=args.redo
    )
    print(f"analysed {len(runs)} runs under {args.runs}; draw them with: site-lens figures --runs {args.runs}")
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    """Figures (HTML + PNG) and tables from run folders and bench folders; no model is loaded."""
    import pandas as pd

    from ..experiments.report import summarise, transfer_path, write_benchmark_figures, write_figures
    from ..tasks import TaskError

    if not args.runs and not args.bench and not args.sparse:
        raise TaskError(
            "nothing to draw: give --runs DIR (run folders), --bench DIR[,DIR] (bench folders) or --sparse DIR"
        )
    dirs = [Path(d) for d in args.bench or []]
    missing = [str(d) for d in dirs if not (d / "rows.csv").is_file()]
    if missing:
        raise TaskError(f"no rows.csv in bench folder(s) {', '.join(missing)}")
    runs = _find_runs(args.runs) if args.runs else []
    out = Path(args.out)
    check_writable(out)
    written: list[Path] = []
    if args.runs:
        path = transfer_path(runs)
        transfer = pd.read_csv(path, index_col=0) if path.is_file() else None
        written += write_figures(runs, out, transfer)
        for name, df in summarise(runs).items():
            print(f"\n[{name}]")
            print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
            if args.tables:
                Path(args.tables).mkdir(parents=True, exist_ok=True)
                df.to_csv(Path(args.tables) / f"{name}.csv", index=False)
    if dirs:
        written += write_benchmark_figures(dirs, out)
    if args.sparse:
        from ..experiments.minimal_report import write_minimal_figures

        written += write_minimal_figures(args.sparse, out)
    print(f"\nwrote {len(written)} files under {out}/:")
    for w in written:
        print(f"  {w}")
    return 0
