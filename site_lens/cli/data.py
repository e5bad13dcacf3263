"""``site-lens data fv``, ``site-lens data bbh`` and ``site-lens data hf``: task folders from other sources."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..sources import SourceError
from ..tasks import SPLITS


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
    from .commands import check_writable

    out = Path(args.out)
    check_request(args.tasks, args.source)  # a bad --tasks or --source is reported before the folder is made
    check_writable(out)
    rows = build_fv(out, tasks=args.tasks, source=args.source, overwrite=args.overwrite)
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
    from .commands import check_writable

    check_writable(Path(args.out))
    rows = build_bbh(
        Path(args.out),
        sdist=Path(args.sdist) if args.sdist else None,
        tasks=args.tasks,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    for r in rows:
        s, ch = r["sizes"], r["chance"]
        chance = "generation" if ch is None else f"chance {ch:.3f}"
        print(
            f"{r['task']:<42} {r['format']:<9} train {s['train']:>4}  valid {s['valid']:>3}  test {s['test']:>3}  {chance}"
        )
    print(f"wrote {len(rows)} task folders and README.md under {args.out}")
    return 0


def cmd_data_hf(args: argparse.Namespace) -> int:
    from ..sources.hub import convert_dataset
    from .commands import check_writable

    check_writable(Path(args.out))
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
    written = convert_dataset(
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
    for path in written:
        print(path)
    return 0
