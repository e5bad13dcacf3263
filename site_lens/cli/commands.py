"""The subcommands' work: each ``cmd_*`` takes the parsed arguments and returns an exit status.

User errors are raised as the package's one-line error types; ``cli.main`` prints them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def check_writable(out: Path) -> list[Path]:
    """Fail before any work if the output folder cannot be written; returns the folders it made, deepest first
    (``remove_empty`` takes them away again where the command then fails, offline say)."""
    from ..tasks import TaskError

    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-test")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        remove_empty(made)
        raise TaskError(f"output folder {out} is not writable ({e.strerror or e})") from None
    return made


def remove_empty(folders: list[Path]) -> None:
    """Remove these folders, deepest first, while they are empty."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:  # not empty (or gone): what is above it stays too
            break


def _progress_bar(total: int, desc: str) -> tuple[Callable[[int, float], None], Callable[[], None]]:
    """Training steps: a bar that appears at the first step (so one-time setup is not counted as steps),
    or without a terminal a line every tenth of the steps."""
    from ..progress import Progress

    state: dict[str, Any] = {}

    def update(step: int, loss: float) -> None:
        if "bar" not in state:  # created at step 1: the rate and the time left count steps only
            state["bar"] = Progress(total, desc, unit="step", every=max(1, total // 10))
            state["bar"].skip()
            return
        state["bar"].done(f"{desc}, loss {loss:.3f}")

    def close() -> None:
        if "bar" in state:
            state["bar"].close()

    return update, close


METHOD_LABELS = {"zero_shot": "zero-shot", "icl": "ICL", "site": "SITE"}
LEGEND = (  # under every scores table of run and demo
    "[lo, hi]: 95 % Wilson interval over the n test items. prefix match: the paper's exact match (the answer\n"
    "starts the first line); strict: the first line is the answer. ms/query: batched generation time per test item\n"
    "(a row stops at its first newline: answers that run on, as zero-shot's often do, decode more tokens)."
)


def _cell(rate: float, n: int) -> str:
    from ..stats import wilson_interval

    lo, hi = wilson_interval(rate * n, n)
    return f"{rate:.2f} [{lo:.2f}, {hi:.2f}]"


def _table(rows: list[dict[str, Any]]) -> str:
    """Scores with n and a 95 % Wilson interval each, and the cost per query."""
    head = f"{'task':<16} {'method':<9} {'n':>4}  {'first token':<17} {'prefix match':<17} {'strict match':<17} {'ms/query':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        n = int(r["n_test"])
        lines.append(
            f"{r['task']:<16} {METHOD_LABELS.get(r['method'], r['method']):<9} {n:>4}  "
            f"{_cell(r['first_token_acc'], n):<17} {_cell(r['exact_match'], n):<17} {_cell(r['strict_match'], n):<17} "
            f"{r['ms_per_query']:>8.1f}"
        )
    return "\n".join(lines)


def require_data_for_fv(names: str, data_dir: str | None) -> None:
    """An FV task name in a comma list without --data fails with the hint where to get the FV tasks."""
    from ..tasks import ABSTRACTIVE, EXTRACTIVE, TaskError, fv_hint

    if data_dir is None:
        for name in (s.strip() for s in names.split(",")):
            if name in ABSTRACTIVE | EXTRACTIVE:
                raise TaskError(fv_hint(name))


def _check_backend(model, cfg) -> None:
    """A backend asked for that the model cannot run fails now, not after stage 1."""
    from ..engine.backend import backend_for

    if cfg.engine.fast and cfg.engine.backend != "auto":
        backend_for(model, cfg.engine.backend)


def _check_task(task, cfg) -> None:
    """A task too small for stage 1's prompts fails before the model loads."""
    from ..stages.embeddings import embedding_prompts

    embedding_prompts(task, cfg.embedding, cfg.seed)


def run_one(model, task, cfg, out: Path, load_s: float | None = None) -> dict[str, Any]:
    """Stages 1-3 and the baselines on one task; then write OUT/adapter/ and OUT/results.json."""
    from ..adapter import save_adapter
    from ..experiments.run import run_task
    from ..files import write_json_atomic

    _check_backend(model, cfg)
    print(
        f"{task.name}: scoring zero-shot and ICL, building the task embedding (setup), then training alpha",
        file=sys.stderr,
        flush=True,
    )
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
    return [res[m] for m in ("zero_shot", "icl", "site") if m in res]


def cmd_run(args: argparse.Namespace) -> int:
    from ..models import load_model, resolve_model_name
    from ..tasks import load_task
    from .args import site_config_from_args

    cfg = site_config_from_args(args)
    task = load_task(args.task, data_dir=args.data)  # bad task input fails before the model loads
    _check_task(task, cfg)
    resolve_model_name(args.model, getattr(args, "engine", None))  # an unknown model fails before anything is written
    out = Path(args.out) if args.out else Path("runs") / args.model / task.name
    check_writable(out)
    t0 = time.perf_counter()
    model = load_model(args.model, device=args.device, dtype=args.dtype, engine=getattr(args, "engine", None))
    res = run_one(model, task, cfg, out, time.perf_counter() - t0)
    print(_table(_rows(res)))
    print(LEGEND)
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res["seconds"].items()))
    print(f"wrote {out / 'results.json'} and {out / 'adapter'}/")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """SITE, zero-shot and ICL on built-in tasks: the table with intervals, alpha heatmaps and training curves."""
    from ..models import load_model
    from ..tasks import load_task
    from .args import site_config_from_args

    cfg = site_config_from_args(args)
    if not args.tasks:
        from ..tasks import TaskError

        raise TaskError("--tasks is empty: give a comma list of task names")
    tasks = [load_task(name, data_dir=args.data) for name in args.tasks]  # bad input fails before any work
    for task in tasks:
        _check_task(task, cfg)
    out = Path(args.out)
    fig_dir = Path(args.figures) if args.figures else out / "figures"
    check_writable(out)
    check_writable(fig_dir)
    t0 = time.perf_counter()
    model = load_model(args.model, device=args.device, dtype=args.dtype, engine=getattr(args, "engine", None))
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    rows, runs = [], {}
    for task in tasks:
        res = run_one(model, task, cfg, out / task.name)
        rows += _rows(res)
        runs[task.name] = res
        print(_table(_rows(res)).split("\n", 2)[-1], flush=True)
    print()
    print(_table(rows))
    print(LEGEND)
    from ..adapter import load_adapter
    from ..analysis.plots import alpha_heatmap, save_figure, training_curve

    for name, res in runs.items():
        alpha = load_adapter(out / name / "adapter").alpha
        written = save_figure(alpha_heatmap(alpha, title=f"SITE head weights, {name}"), fig_dir / f"alpha_{name}")
        if res.get("history"):
            written += save_figure(
                training_curve(res["history"], title=f"alpha training, {name}"), fig_dir / f"training_{name}"
            )
        print("wrote " + ", ".join(str(w) for w in written))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """Apply a saved adapter to new inputs, one per line, and print or write one generation per input."""
    import torch

    from ..adapter import load_adapter
    from ..config import EvalConfig
    from ..experiments.run import answer_line, predict
    from ..files import write_text_atomic
    from ..models import load_model, model_identity
    from ..tasks import TaskError, format_query

    cfg = EvalConfig(
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, max_test=None
    )  # bad values fail now
    if args.engine == "hf" and not isinstance(getattr(torch, args.dtype, None), torch.dtype):
        raise TaskError(f"unknown dtype '{args.dtype}' (try float32, bfloat16, float16)")
    adapter = load_adapter(args.adapter)
    if args.out and Path(args.out).is_dir():
        raise TaskError(f"--out {args.out} is a folder; give a file name")
    if args.input in (None, "-"):
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as e:
            raise TaskError(f"standard input is not UTF-8 text ({e})") from None
    else:
        try:
            text = Path(args.input).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise TaskError(f"{args.input}: cannot read inputs ({e.__class__.__name__}: {e})") from None
    inputs = [line.strip() for line in text.splitlines() if line.strip()]
    if not inputs:
        raise TaskError(f"no inputs in {args.input or 'standard input'}: give one input per line")
    if args.out:
        check_writable(Path(args.out).parent)
    name = args.model or adapter.model.get("name")
    if args.engine == "hf":  # transformers' own generate, the adapter injected by site_lens.models.hf
        from ..models import hf

        model, tok = hf.load_hf_model(name, dtype=getattr(torch, args.dtype), device_map=args.device_map or args.device)
        if not args.zero_shot:
            adapter.check_model(hf.hf_identity(model))
        gens = hf.generate(
            model,
            tok,
            [format_query(x) for x in inputs],  # the zero-shot prompt, as predict writes it
            None if args.zero_shot else adapter,
            max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.batch_size,
        )
        lines = [answer_line(g) for g in gens]
    else:
        engine = None if args.engine == "transformer-lens" else args.engine
        model = load_model(name, device=args.device, dtype=args.dtype, engine=engine)
        adapter.check_model(model_identity(model))
        lines = predict(model, inputs, None if args.zero_shot else adapter, cfg)
    if args.with_input:
        lines = [f"{x}\t{y}" for x, y in zip(inputs, lines)]
    if args.out:
        write_text_atomic(args.out, "".join(f"{line}\n" for line in lines))
        print(f"wrote {len(lines)} generations to {args.out}", file=sys.stderr)
    else:
        print("\n".join(lines))
    return 0


def task_listing(data_dir: str | None) -> list[dict[str, Any]]:
    """``site-lens tasks --json``: name, category, counts per split, case sensitivity and source of each task."""
    from ..tasks import SPLITS, available_tasks, category, load_task

    out = []
    for n in available_tasks(data_dir):
        t = load_task(n, data_dir=data_dir)
        counts = {s: len(t.split(s)) for s in SPLITS}
        out.append(
            {"name": n, "category": category(t), **counts, "case_sensitive": bool(t.case_sensitive), "source": t.source}
        )
    return out


def cmd_tasks(args: argparse.Namespace) -> int:
    """The built-in tasks, or those under --data: one line each, or with --json a JSON list."""
    from ..tasks import available_tasks, category, load_task

    if getattr(args, "json", False):
        import json

        print(json.dumps(task_listing(args.data), indent=1))
        return 0
    for n in available_tasks(args.data):
        t = load_task(n, data_dir=args.data)
        print(
            f"{n:<28} train {len(t.train):>5}  valid {len(t.valid):>4}  test {len(t.test):>5}  "
            f"case-sensitive {'yes' if t.case_sensitive else 'no ':<3}  {category(t)}"
        )
    from ..config import EvalConfig

    n = EvalConfig().max_test
    print(f"test: the split's size; run and bench score its first {n} items (--max-test N, or all)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Every (task, method, seed) row, resumable; then OUT/summary.{csv,md}."""
    from ..experiments import bench
    from ..methods import METHODS
    from ..models import load_model
    from ..progress import write
    from .args import site_config_from_args

    if args.methods.strip() == "list":
        from ..methods import describe_method

        for m in METHODS:
            print(f"{m:<10} {describe_method(m)}")
        return 0
    cfg = site_config_from_args(args)  # a bad config value fails before the model loads
    from ..config import ConfigError
    from ..methods import OPTION_METHODS, SEQUENCE_METHODS, sparse_refusal

    methods = bench.resolve(
        args.methods, list(METHODS), "method", [m for m in METHODS if m not in (*SEQUENCE_METHODS, *OPTION_METHODS)]
    )
    part = args.shard or bench.slurm_shard()
    if part and not args.shard:
        print(f"Slurm job array: shard {part}", flush=True)
    require_data_for_fv(args.tasks, args.data)
    tasks = bench.shard(bench.resolve(args.tasks, bench.available_tasks(args.data), "task"), part)
    why = sparse_refusal(cfg, methods, args.task_batch)
    if why:
        raise ConfigError(why)  # before the model loads
    seeds = args.seeds or [cfg.seed]
    out = Path(args.out) if args.out else Path("runs") / "bench" / args.model
    check_writable(out)
    model = load_model(
        args.model, device=args.device, dtype=args.dtype, n_devices=args.n_devices, engine=getattr(args, "engine", None)
    )

    def report(r: dict[str, Any]) -> None:  # a table line on stdout (the progress line goes to stderr)
        write(
            f"{r['task']:<26} {r['method']:<10} first-tok {r['first_token_acc']:.3f} exact {r['exact_match']:.3f} "
            f"n {r['n_test']:>4} params {r['n_trainable']:>9,} fit {r['fit_seconds']:7.1f}s {r['ms_per_query']:7.1f} ms/q"
        )

    if "site" in methods:
        _check_backend(model, cfg)
    bench.run_bench(model, tasks, methods, seeds, out, args.data, cfg=cfg, report=report, task_batch=args.task_batch)
    print((out / "summary.md").read_text())
    print(f"wrote {out / 'summary.csv'}, {out / 'summary.md'}, {out / 'rows.csv'}")
    return 0


def cmd_bench_merge(args: argparse.Namespace) -> int:
    """Summarise the rows of several bench output folders (e.g. shards) into one."""
    from ..experiments import bench

    out = Path(args.out or args.dirs[0])
    check_writable(out)
    bench.merge([Path(d) for d in args.dirs], out)
    print((out / "summary.md").read_text())
    return 0
