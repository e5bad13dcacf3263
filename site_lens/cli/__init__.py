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
from ..config import K_GRID, SPARSE_WEIGHTS
from .analysis_commands import cmd_analyse, cmd_figures, cmd_sparsify
from .commands import cmd_bench, cmd_bench_merge, cmd_demo, cmd_predict, cmd_run, cmd_tasks
from .data import cmd_data_bbh, cmd_data_fv, cmd_data_hf, parse_splits

DESCRIPTION = (
    "SITE (soft head selection for ICL-derived task embeddings) on TransformerLens: build a task embedding "
    "from few-shot prompts, learn one weight per attention head, inject it into zero-shot prompts, and "
    "analyse which heads carry the task."
)
DEMO_TASKS = "uppercase,next-number"  # generated built-in tasks with 101 test items each


def _user_errors() -> tuple[type[BaseException], ...]:
    from ..adapter import AdapterError
    from ..config import ConfigError
    from ..models import ModelError
    from ..sources import SourceError
    from ..tasks import TaskError
    from ..tokens import PromptTooLongError

    return (ConfigError, PromptTooLongError, AdapterError, ModelError, TaskError, SourceError)


def comma_list(text: str) -> list[str]:
    """'a,b, c' -> ['a', 'b', 'c'] (empty items dropped)."""
    return [s.strip() for s in text.split(",") if s.strip()]


def seed_list(text: str) -> list[int]:
    """A comma list of integer seeds, e.g. '0,1,2'."""
    try:
        seeds = [int(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got '{text}'") from None
    if not seeds:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return list(dict.fromkeys(seeds))


def float_list(text: str) -> list[float]:
    """A comma list of numbers, e.g. '0.001,0.01'."""
    try:
        values = [float(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got '{text}'") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def int_list(text: str) -> list[int]:
    """A comma list of positive integers, e.g. '1,2,4'."""
    try:
        values = [int(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got '{text}'")
    return values


def positive_int_or_all(text: str) -> int | None:
    """A positive integer, or 'all' (None)."""
    from ..config import int_or_all

    value = int_or_all(text)
    if value is not None and value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {value}")
    return value


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
    "bench-merge": """examples:
  site-lens bench-merge runs/bench/shard0 runs/bench/shard1 --out runs/bench/smollm2-135m""",
    "analyse": """examples:
  site-lens analyse --runs runs/fv --data data/fv
  site-lens figures --runs runs/fv   # then draw, into runs/figures""",
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
  site-lens figures --bench results/smollm2-135m,results/gemma-3-270m --out runs/bench_figures
  scripts/make_figures.sh                                               # redraws the committed figures/""",
}

DATA_EXAMPLES = {  # the data sources' own --help
    "fv": """examples:
  site-lens data fv --out data/fv
  site-lens data fv --out data/fv --tasks antonym,country-capital
  site-lens data fv --out data/fv --source runs/Soft_Injection   # a mirror: a git clone of the release, or a URL
  site-lens run --data data/fv --task antonym""",
    "bbh": """examples:
  site-lens data bbh --out data/bbh
  site-lens data bbh --sdist bigbench-1.0.0.tar.gz --tasks navigate,snarks --out data/bbh""",
    "hf": """examples:
  site-lens data hf facebook/anli --out data/anli --task-name anli_r1 \\
      --input "Premise: {premise}\\nHypothesis: {hypothesis}" --output label \\
      --splits train=train_r1,valid=dev_r1,test=test_r1""",
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
        from ..config import add_site_arguments

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
        help="folder searched recursively for run folders (results.json + adapter/); the analyses are written into them",
    )
    model_args(p)
    data_arg(p)
    p.add_argument(
        "--max-test",
        "--limit",
        type=positive_int_or_all,
        default=100,
        metavar="N|all",
        help="test items for patching and transfer (default: 100)",
    )
    p.add_argument("--cie-prompts", type=int, default=25, help="shuffled-label prompts for the CIE (default: 25)")
    p.add_argument("--draws", type=int, default=5, help="random head sets per k (default: 5)")
    p.add_argument("--redo", action="store_true", help="recompute analyses that already exist")

    p = add(
        "sparsify",
        cmd_sparsify,
        "minimal head sets: sparse SITE swept over its penalty against top-k by alpha, by CIE and random k; resumable",
    )
    site_args(p)
    p.add_argument("--tasks", required=True, help="'all' or a comma list of task names")
    p.add_argument("--seeds", type=seed_list, default=None, help="comma list of seeds, e.g. 0,1,2 (default: --seed)")
    p.add_argument("--out", default="runs/sparse", help="output folder (default: runs/sparse)")
    p.add_argument("--penalties", type=comma_list, default=["l0", "l1"], help="l0, l1 or both (default: l0,l1)")
    p.add_argument(
        "--weights-l0",
        type=float_list,
        default=list(SPARSE_WEIGHTS["l0"]),
        help=f"l0 weights, nats per open head (default: {','.join(map(str, SPARSE_WEIGHTS['l0']))})",
    )
    p.add_argument(
        "--weights-l1",
        type=float_list,
        default=list(SPARSE_WEIGHTS["l1"]),
        help=f"l1 weights (default: {','.join(map(str, SPARSE_WEIGHTS['l1']))})",
    )
    p.add_argument(
        "--path-steps", type=int, default=100, help="steps per weight along the warm-started path (default: 100)"
    )
    p.add_argument(
        "--ks",
        type=int_list,
        default=list(K_GRID),
        help=f"k grid of the rankings, plus every head (default: {','.join(map(str, K_GRID))})",
    )
    p.add_argument("--draws", type=int, default=2, help="random k-sets per k (default: 2)")
    p.add_argument(
        "--score-valid",
        type=positive_int_or_all,
        default=100,
        metavar="N|all",
        help="valid items that score the head sets, to choose k, weight and threshold (default: 100)",
    )
    p.add_argument(
        "--rankings-seeds",
        type=seed_list,
        default=None,
        help="seeds that also score the rankings and random sets (default: all)",
    )
    p.add_argument(
        "--shared", action="store_true", help="also train one alpha over all the tasks (first seed's t per task)"
    )
    p.add_argument("--redo", action="store_true", help="recompute finished (task, seed) folders")

    p = add(
        "data",
        None,
        "build task folders: the 45 FV tasks with the SITE paper's splits, BIG-Bench Hard-style tasks from the "
        "bigbench sdist, or a hub dataset",
    )
    data_sub = p.add_subparsers(dest="source", required=True, metavar="SOURCE", help="fv, bbh or hf")
    q = data_sub.add_parser(
        "fv",
        parents=[verbose],
        help="download the 45 function-vector tasks with the SITE paper's train/valid/test splits",
        description="Download the 45 function-vector tasks (Todd et al. 2024, MIT) with the train/valid/test\n"
        "splits of the SITE paper's code release (github.com/SNU-DRL/Soft_Injection, Apache-2.0, at a\n"
        "pinned commit): one folder per task (train.json, valid.json, test.json as released, and\n"
        "meta.json), the two licence texts and a README.md. Each file is checked (items, count, sha256);\n"
        "a task folder already complete is skipped, and an interrupted run leaves only complete ones.",
        epilog=DATA_EXAMPLES["fv"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.set_defaults(func=cmd_data_fv)
    q.add_argument("--out", required=True, help="folder for the task folders and README.md, e.g. data/fv")
    q.add_argument("--tasks", type=comma_list, default=None, help="comma list of FV tasks (default: all 45)")
    q.add_argument(
        "--source",
        default=None,
        help="a mirror of the release: a base URL, a file:// URL or a folder holding dataset/TASK/{train,valid,"
        "test}.json (and LICENSE; function_vectors/LICENSE optional) (default: raw.githubusercontent.com at the pinned commit)",
    )
    q.add_argument("--overwrite", action="store_true", help="replace task folders that are not the release's")
    q = data_sub.add_parser(
        "bbh",
        parents=[verbose],
        help="BBH-style tasks from the bigbench==1.0.0 sdist",
        description="BBH-style tasks from the bigbench==1.0.0 sdist: one task folder each, and a README.md",
        epilog=DATA_EXAMPLES["bbh"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.set_defaults(func=cmd_data_bbh)
    q.add_argument("--out", required=True, help="folder for the task folders and README.md")
    q.add_argument("--sdist", default=None, help="a local bigbench-1.0.0.tar.gz (default: pip download it once)")
    q.add_argument("--tasks", type=comma_list, default=None, help="comma list of BBH subtasks (default: all 27)")
    q.add_argument("--seed", type=int, default=0, help="seed of the splits and the option order (default: 0)")
    q.add_argument("--overwrite", action="store_true", help="replace task folders that exist")
    q = data_sub.add_parser(
        "hf",
        parents=[verbose],
        help="a datasets.load_dataset dataset into the task layout",
        description="a datasets.load_dataset dataset into the task layout (a folder of train/valid/test.json)",
        epilog=DATA_EXAMPLES["hf"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.set_defaults(func=cmd_data_hf)
    q.add_argument("name", help="dataset name for datasets.load_dataset, e.g. facebook/anli")
    q.add_argument(
        "--config", default=None, help="dataset configuration name, as load_dataset's second argument (default: none)"
    )
    q.add_argument("--out", required=True, help="folder for the task folder(s)")
    q.add_argument("--task-name", default=None, help="task folder name (default: from the dataset name)")
    q.add_argument(
        "--input", required=True, help="input field, or a template over fields such as '{premise} {hypothesis}'"
    )
    q.add_argument(
        "--output", required=True, help="answer field: a string, a ClassLabel index, or with --options an index/letter"
    )
    q.add_argument("--options", default=None, help="field holding each row's list of options (lettered (A), (B), ...)")
    q.add_argument("--label-names", type=comma_list, default=None, help="names for an integer label field, e.g. yes,no")
    q.add_argument("--group-by", default=None, help="one task per value of this field (e.g. MMLU-Pro's category)")
    q.add_argument(
        "--splits",
        type=parse_splits,
        default={"train": "train", "valid": "validation", "test": "test"},
        help="OURS=THEIRS pairs for all three splits, or one pair: that split is divided "
        "(default: train=train,valid=validation,test=test)",
    )
    q.add_argument(
        "--max-items", type=int, default=None, help="sample at most this many rows per split, seeded (default: all)"
    )
    q.add_argument("--seed", type=int, default=0, help="seed of sampling and of a divided split (default: 0)")
    q.add_argument("--overwrite", action="store_true", help="replace task folders that exist")

    p = add("figures", cmd_figures, "draw figures (HTML + PNG) and tables from run and bench folders; loads no model")
    p.add_argument(
        "--runs",
        default=None,
        help="folder searched recursively for run folders (after analyse: patching, CIE, transfer)",
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
    try:
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
