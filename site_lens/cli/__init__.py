"""The site-lens command: thin subcommands over the Python API.

Errors in user input (bad task file, unknown model or task, too few examples,
prompt too long, mismatched adapter) print one line, ``site-lens: error: ...``,
and exit with status 2. Multi-value flags take comma lists; ``-v`` may stand
before or after the subcommand.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap

from .._version import __version__
from ..config import AnalyseConfig, MinimalConfig
from .analysis_commands import cmd_analyse, cmd_figures, cmd_sparsify
from .args import add_arguments, comma_list, positive_int, seed_list
from .atlas import add_atlas_parsers
from .commands import cmd_bench, cmd_bench_merge, cmd_demo, cmd_predict, cmd_run, cmd_tasks
from .data import add_data_parsers

DESCRIPTION = (
    "SITE (soft head selection for ICL-derived task embeddings) on TransformerLens: build a task embedding "
    "from few-shot prompts, learn one weight per attention head, inject it into zero-shot prompts, and "
    "analyse which heads carry the task."
)
DEMO_TASKS = "uppercase,next-number"  # generated built-in tasks with 101 test items each


# errors in user input, by the module that defines each
USER_ERRORS = {
    "config": "ConfigError",
    "tokens": "PromptTooLongError",
    "adapter": "AdapterError",
    "models.engines": "ModelError",
    "tasks": "TaskError",
    "sources": "SourceError",
    "atlas.store": "AtlasError",
}


def _user_errors() -> tuple[type[BaseException], ...]:
    """The user-input error classes of the modules loaded so far (one not loaded raised nothing), so that an
    error in a light command (``tasks --data``) does not load torch just to be reported."""
    loaded = (sys.modules.get(f"site_lens.{module}") for module in USER_ERRORS)
    return tuple(getattr(m, name) for m, name in zip(loaded, USER_ERRORS.values(), strict=True) if m is not None)


# ---------------------------------------------------------------- the parser

EXAMPLES = {
    "run": """examples:
  site-lens run --task opposites
  site-lens run --task opposites --steps 100 --out runs/opposites
  site-lens run --data data/fv --task country-capital --max-test all --device cuda""",
    "demo": f"""examples:
  site-lens demo                                  # tasks {DEMO_TASKS}
  site-lens demo --tasks opposites,capital-cities --out runs/demo2""",
    "predict": """examples:
  printf 'bright\\nriver\\n' | site-lens predict --adapter runs/demo/uppercase/adapter
  site-lens predict --adapter runs/opposites/adapter --input words.txt --out answers.txt
  site-lens predict --adapter runs/opposites/adapter --input words.txt --engine hf --device-map auto""",
    "tasks": """examples:
  site-lens tasks
  site-lens tasks --data data/fv --json""",
    "bench": """examples:
  site-lens bench --methods list                                        # the methods, one line each
  site-lens bench --tasks uppercase --methods zero_shot,site --limit 20   # writes runs/bench/smollm2-135m
  site-lens bench --data data/fv --tasks antonym,capitalize --methods zero_shot,icl,site --seeds 0,1,2
  site-lens bench --data data/fv --shard 0/4 --out runs/bench/shard0    # then: site-lens bench-merge ...""",
    "atlas": """examples:
  site-lens atlas build --model smollm2-135m --data data/fv --from results/smollm2-135m,results/seeds/smollm2-135m \\
      --out atlases/smollm2-135m
  site-lens atlas show atlases/smollm2-135m --task antonym
  site-lens atlas compare atlases/smollm2-135m atlases/gemma-3-270m""",
    "bench-merge": """examples:
  site-lens bench-merge runs/bench/shard0 runs/bench/shard1 --out runs/bench/smollm2-135m""",
    "analyse": """examples:
  site-lens analyse --runs runs/fv --data data/fv
  site-lens figures --runs runs/fv   # then draw, into runs/figures
  site-lens analyse --runs runs/uppercase-adapter   # one adapter folder (sl.save_adapter), a built-in task""",
    "sparsify": """examples:
  site-lens sparsify --data data/fv --tasks antonym,capitalize --seeds 0,1,2 --out runs/sparse
  site-lens sparsify --data data/fv --tasks antonym --penalties l0 --weights-l0 0.003,0.01 --shared
  site-lens figures --sparse runs/sparse   # then draw, into runs/figures""",
    "data": """examples:
  site-lens data fv --out data/fv                    # the 45 FV tasks with the SITE paper's splits (13 MB)
  site-lens data bbh --out data/bbh                  # pip-downloads the bigbench sdist (358 MB) once
  site-lens data bbh --sdist bigbench-1.0.0.tar.gz --tasks navigate,snarks --out data/bbh
  site-lens data hf facebook/anli --out data/anli --task-name anli_r1 \\
      --input "Premise: {premise}\\nHypothesis: {hypothesis}" --output label \\
      --splits train=train_r1,valid=dev_r1,test=test_r1
  site-lens data hf TIGER-Lab/MMLU-Pro --out data/mmlu_pro --input question --output answer_index \\
      --options options --group-by category --splits test=test
  site-lens bench --data data/bbh --tasks navigate,snarks --methods zero_shot,icl,site""",
    "figures": """examples:
  site-lens figures --runs results/head_specificity/runs                # writes runs/figures
  site-lens figures --runs runs/uppercase-adapter                       # one adapter folder: its alpha map
  site-lens figures --bench results/smollm2-135m,results/gemma-3-270m --out runs/bench_figures
  scripts/make_figures.sh                                               # redraws the committed figures/""",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``site-lens`` argument parser, one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="site-lens",
        description=textwrap.fill(DESCRIPTION, 80),
        epilog="examples:\n  site-lens tasks\n  site-lens demo\n  site-lens run --task opposites\n"
        "  site-lens COMMAND --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"site-lens {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log at INFO level (also accepted after the subcommand)"
    )
    verbose = argparse.ArgumentParser(add_help=False)  # -v after the subcommand too, without overriding one before it
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=help,
            epilog=EXAMPLES[name],
            parents=[verbose],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func)
        return p

    def model_args(p: argparse.ArgumentParser, default: str | None = "smollm2-135m", engine: bool = True) -> None:
        p.add_argument(
            "--model",
            default=default,
            help=f"smollm2-135m or gemma-3-270m (embedded), or a TransformerLens name (needs the hub) (default: {default})"
            if default
            else "model name (default: the one the adapter was trained on)",
        )
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps, ... (default: cpu)")
        p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (default: float32)")
        if not engine:
            return
        p.add_argument(
            "--engine",
            default=None,
            choices=["hooked", "bridge"],
            help="hooked (HookedTransformer) or bridge (TransformerBridge; the only engine on TransformerLens 4) "
            "(default: hooked on TransformerLens 3.x, bridge on 4.x)",
        )

    def data_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--data",
            default=None,
            help="folder of tasks: FV task folders (train/valid/test.json) or .json lists (default: the built-in tasks)",
        )

    def site_args(p: argparse.ArgumentParser) -> None:
        from .args import add_site_arguments

        model_args(p)
        data_arg(p)
        add_site_arguments(p)

    p = add("run", cmd_run, "stages 1-3 on one task, plus zero-shot and ICL; writes OUT/results.json and OUT/adapter/")
    site_args(p)
    p.add_argument(
        "--task", required=True, help="a built-in task name, a task under --data, or a path (folder or .json)"
    )
    p.add_argument("--out", default=None, help="output folder (default: runs/MODEL/TASK)")

    p = add("demo", cmd_demo, "SITE against zero-shot and ICL on built-in tasks: scores with intervals, figures")
    site_args(p)
    p.add_argument(
        "--tasks",
        type=comma_list,
        default=comma_list(DEMO_TASKS),
        help=f"comma list of built-in tasks (default: {DEMO_TASKS})",
    )
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--figures", default=None, help="folder for the figures (default: OUT/figures)")

    p = add(
        "predict", cmd_predict, "apply a saved adapter to new inputs (one per line); prints one generation per line"
    )
    p.add_argument("--adapter", required=True, help="an adapter folder written by run, demo or save_adapter")
    p.add_argument(
        "--input",
        default=None,
        help="file of inputs, one per line, blank lines skipped; '-': standard input (default: standard input)",
    )
    p.add_argument("--out", default=None, help="file for the generations (default: print them)")
    p.add_argument("--with-input", action="store_true", help="print (or write) 'input<TAB>generation' lines")
    p.add_argument("--zero-shot", action="store_true", help="generate without the adapter (for comparison)")
    p.add_argument("--max-new-tokens", type=int, default=20, help="greedy tokens per input (default: 20)")
    p.add_argument("--batch-size", type=int, default=64, help="inputs per generation batch (default: 64)")
    p.add_argument(
        "--engine",
        choices=("transformer-lens", "hooked", "bridge", "hf"),
        default="transformer-lens",
        help="transformer-lens: site-lens's TransformerLens model on its default engine; hooked or bridge: on that "
        "engine; hf: a plain transformers model and its own generate (site_lens.models.hf) (default: transformer-lens)",
    )
    p.add_argument(
        "--device-map", default=None, help="with --engine hf: transformers' device_map, e.g. auto (default: --device)"
    )
    model_args(p, default=None, engine=False)

    p = add("tasks", cmd_tasks, "list the built-in tasks, or the tasks under --data (folders and .json lists)")
    data_arg(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list instead: name, category, counts per split, case_sensitive and source of each task",
    )

    p = add(
        "bench", cmd_bench, "benchmark methods x tasks x seeds; resumable; writes OUT/rows/ and OUT/summary.{csv,md}"
    )
    site_args(p)
    p.add_argument("--tasks", default="all", help="'all' or a comma list of task names (default: all)")
    p.add_argument(
        "--methods",
        default="all",
        help="'all', 'list' (print each method with a one-line description and exit) or a comma list: "
        "zero_shot,icl,site,fv,tv,i2cl,mtv,lora,ia3, and the trained ones with the answer-sequence objective: "
        "site_seq,i2cl_seq,lora_seq,ia3_seq, or on multiple-choice tasks the option-token objective: "
        "site_opt,i2cl_opt,lora_opt,ia3_opt (these eight are not in 'all') (default: all)",
    )
    p.add_argument("--seeds", type=seed_list, default=None, help="comma list of seeds, e.g. 0,1,2 (default: --seed)")
    p.add_argument("--out", default=None, help="output folder (default: runs/bench/MODEL)")
    p.add_argument(
        "--task-batch",
        type=positive_int,
        default=1,
        help="fit up to this many SITE rows (task, seed) in one stage-2 loop, a task's seeds together where they "
        "fit, sharing its prompts' prefixes (each row's theta its own fit's; memory grows with it: see "
        "BENCHMARKS.md) (default: 1, one at a time)",
    )
    p.add_argument(
        "--shard",
        default=None,
        help="I/N: run tasks I, I+N, ... of the sorted list (I from 0). Processes may also share one --out: each "
        "row is locked while it runs (default: inside a Slurm job array, the array's own index and size; else all)",
    )
    p.add_argument(
        "--n-devices",
        type=int,
        default=1,
        help="devices to split the model over (TransformerLens names only) (default: 1)",
    )

    p = add("bench-merge", cmd_bench_merge, "merge bench output folders (shards) into one summary")
    p.add_argument("dirs", nargs="+", help="bench output folders")
    p.add_argument("--out", default=None, help="where to write the summary (default: the first folder)")

    p = add("analyse", cmd_analyse, "patching, CIE and transfer for run folders (loads the model; slow)")
    p.add_argument(
        "--runs",
        required=True,
        help="folder searched recursively for run folders (results.json + adapter/), or one adapter folder (its task "
        "from the adapter; --data for a task from a data folder); the analyses are written into them",
    )
    model_args(p, default=None)
    data_arg(p)
    add_arguments(p, AnalyseConfig, "analyses")
    p.add_argument("--redo", action="store_true", help="recompute analyses that already exist")

    p = add(
        "sparsify",
        cmd_sparsify,
        "minimal head sets: sparse SITE swept over its penalty against top-k by alpha, by CIE, by attribution and "
        "random k; resumable",
    )
    site_args(p)
    p.add_argument("--tasks", required=True, help="'all' or a comma list of task names")
    p.add_argument("--seeds", type=seed_list, default=None, help="comma list of seeds, e.g. 0,1,2 (default: --seed)")
    p.add_argument("--out", default="runs/sparse", help="output folder (default: runs/sparse)")
    add_arguments(p, MinimalConfig, "minimal head sets")
    p.add_argument(
        "--rankings-seeds",
        type=seed_list,
        default=None,
        help="seeds that also score the rankings and random sets (default: all)",
    )
    p.add_argument("--redo", action="store_true", help="recompute finished (task, seed) folders")

    p = add(
        "data",
        None,
        "build task folders: the 45 FV tasks with the SITE paper's splits, BIG-Bench Hard-style tasks from the "
        "bigbench sdist, or a hub dataset",
    )
    add_data_parsers(p, verbose)

    p = add("atlas", None, "head atlases: every task's SITE head map of a model, built once, shown, compared, shared")
    add_atlas_parsers(p, verbose)

    p = add("figures", cmd_figures, "draw figures (HTML + PNG) and tables from run and bench folders; loads no model")
    p.add_argument(
        "--runs",
        default=None,
        help="folder searched recursively for run folders, or one adapter folder (after analyse: patching, CIE, "
        "transfer)",
    )
    p.add_argument(
        "--bench", type=comma_list, default=None, help="comma list of bench output folders (each with rows.csv)"
    )
    p.add_argument("--sparse", default=None, help="a sparsify output folder: recovery against k, minimal sets, overlap")
    p.add_argument(
        "--out",
        default="runs/figures",
        help="folder for the figures, with one plotly.min.js the HTML files load (default: runs/figures, not "
        "tracked by git; the committed figures/ are redrawn by scripts/make_figures.sh, which passes --out figures)",
    )
    p.add_argument("--tables", default=None, help="also write the run summary tables as CSV into this folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    from ..malloc import keep_freed
    from ..progress import shown

    keep_freed()  # big tensors reuse freed pages (SITE_LENS_KEEP_FREED=0: malloc as it is)
    try:
        with shown():  # a bar on a terminal, else one line per finished unit on stderr
            return int(args.func(args) or 0)
    except _user_errors() as e:
        print(f"site-lens: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("site-lens: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head etc.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
