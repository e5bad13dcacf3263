"""``site-lens data fv``, ``site-lens data bbh`` and ``site-lens data hf``: task folders from other sources."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..sources import SourceError
from ..tasks import SPLITS
from .args import comma_list

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


def parse_splits(text: str) -> dict[str, str]:
    """'train=train_r1,valid=dev_r1,test=test_r1' -> {"train": "train_r1", ...}."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        ours, sep, theirs = part.partition("=")
        if not sep or ours.strip() not in SPLITS or not theirs.strip():
            raise argparse.ArgumentTypeError(f"expected OURS=THEIRS pairs with OURS in train/valid/test, got {part!r}")
        out[ours.strip()] = theirs.strip()
    if not out:
        raise argparse.ArgumentTypeError("expected at least one OURS=THEIRS pair")
    return out


def cmd_data_fv(args: argparse.Namespace) -> int:
    from ..sources.fv import build_fv, check_request
    from .commands import check_writable, remove_empty

    out = Path(args.out)
    check_request(args.tasks, args.source)  # a bad --tasks or --source is reported before the folder is made
    made = check_writable(out)
    try:
        rows = build_fv(out, tasks=args.tasks, source=args.source, overwrite=args.overwrite)
    except BaseException:
        remove_empty(made)  # offline, say: no empty folder left behind
        raise
    for r in rows:
        s = r["sizes"]
        print(
            f"{r['task']:<26} {r['category']:<11} train {s['train']:>4}  valid {s['valid']:>3}  test {s['test']:>4}  "
            f"{r['status']}"
        )
    fetched = sum(r["status"] == "downloaded" for r in rows)
    print(f"{fetched} task folders downloaded, {len(rows) - fetched} already there; README.md under {out}")
    return 0


def cmd_data_bbh(args: argparse.Namespace) -> int:
    from ..sources.bbh import build_bbh
    from .commands import check_writable, remove_empty

    made = check_writable(Path(args.out))
    try:
        rows = build_bbh(
            Path(args.out),
            sdist=Path(args.sdist) if args.sdist else None,
            tasks=args.tasks,
            seed=args.seed,
            overwrite=args.overwrite,
        )
    except BaseException:
        remove_empty(made)
        raise
    for r in rows:
        s, ch = r["sizes"], r["chance"]
        chance = "generation" if ch is None else f"chance {ch:.3f}"
        print(
            f"{r['task']:<42} {r['format']:<9} train {s['train']:>4}  valid {s['valid']:>3}  test {s['test']:>3}  {chance}"
        )
    print(f"wrote {len(rows)} task folders and README.md under {args.out}")
    return 0


def cmd_data_hf(args: argparse.Namespace) -> int:
    from .commands import check_writable, remove_empty

    made = check_writable(Path(args.out))
    try:
        written = _data_hf(args)
    except BaseException:
        remove_empty(made)  # a failed load or conversion leaves no empty folder behind
        raise
    for path in written:
        print(path)
    return 0


def _data_hf(args: argparse.Namespace) -> list[Path]:
    from ..sources.hub import convert_dataset

    try:
        import datasets
    except ImportError:
        raise SourceError("site-lens data hf needs the datasets package (pip install datasets)") from None
    try:
        ds = datasets.load_dataset(args.name, args.config)
    except Exception as e:  # the hub's errors are many and unrelated; name the dataset and the cause
        raise SourceError(
            f"cannot load dataset {args.name!r}: {e.__class__.__name__}: {str(e).splitlines()[0]}"
        ) from None
    return convert_dataset(
        ds,
        Path(args.out),
        args.task_name or args.name.split("/")[-1].lower().replace("-", "_"),
        input=args.input.replace("\\n", "\n"),  # a typed \n in a template is a newline
        output=args.output,
        splits=args.splits,
        options=args.options,
        label_names=args.label_names,
        group_by=args.group_by,
        max_items=args.max_items,
        seed=args.seed,
        source=f"datasets.load_dataset({args.name!r}, {args.config!r})",
        overwrite=args.overwrite,
    )


def add_data_parsers(p: argparse.ArgumentParser, verbose: argparse.ArgumentParser) -> None:
    """The `data` subcommand's sources: fv, bbh, hf."""
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
