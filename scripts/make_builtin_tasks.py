"""Write the generated built-in tasks (uppercase, first-letter, next-number) into site_lens/data/tasks/.

Each is a JSON list of 480 pairs, so the loader's fixed 70/9/21 split leaves 101 test items.
The words come from scripts/words.txt (a list written for site-lens). Run from the repository root:

    python scripts/make_builtin_tasks.py          # rewrite the files
    python scripts/make_builtin_tasks.py --check  # exit 1 if a committed file differs
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "site_lens" / "data" / "tasks"
N_PAIRS = 480
SEED = 20261201


def words() -> list[str]:
    ws = sorted(set((ROOT / "scripts" / "words.txt").read_text().split()))
    random.Random(SEED).shuffle(ws)
    return ws[:N_PAIRS]


def tasks() -> dict[str, list[dict[str, str]]]:
    ws = words()
    numbers = random.Random(SEED + 1).sample(range(1, 999), N_PAIRS)
    return {
        "uppercase": [{"input": w, "output": w.upper()} for w in ws],
        "first-letter": [{"input": w, "output": w[0]} for w in ws],
        "next-number": [{"input": str(n), "output": str(n + 1)} for n in numbers],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = ap.parse_args()
    stale = []
    for name, pairs in tasks().items():
        text = json.dumps(pairs, indent=1, ensure_ascii=False) + "\n"
        path = OUT / f"{name}.json"
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path} ({len(pairs)} pairs)")
    if stale:
        print("differ from the generator: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
