"""Prompt-prefix lengths and the key/value memory of a many-task fit, per embedded model.

For each FV task: the mean prefix length (every token of a zero-shot prompt but its last) of the
first 400 training prompts and of up to 100 valid prompts, with the model's tokenizer. The
many-task fit (``selection_batched.BatchedAlphaTrainer``) keeps the prefixes of 50 steps'
training prompts (one per step) and of every valid prompt, for every task at once: their keys and
values, in float32, are what this prints for all 45 tasks.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefix_memory.py --data data/fv \\
        > benchmarks/results/prefix_memory.txt
"""

from __future__ import annotations

import argparse
import statistics

import site_lens as sl
from site_lens.stages.objectives import train_valid_examples
from site_lens.tasks import available_tasks, load_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the FV task folder")
    ap.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    ap.add_argument("--ahead", type=int, default=50, help="training steps whose prefixes are cached (default 50)")
    args = ap.parse_args()
    for name in args.models.split(","):
        model = sl.load_model(name)
        c = model.cfg
        kv_heads = getattr(c, "n_key_value_heads", None) or c.n_heads
        per_token = c.n_layers * 2 * kv_heads * c.d_head * 4  # keys and values, float32
        total, rows = 0.0, []
        for task in sorted(available_tasks(args.data)):
            train, valid = train_valid_examples(model, load_task(task, data_dir=args.data))
            tr = statistics.mean(len(e.tokens) - 1 for e in train[:400])
            va = statistics.mean(len(e.tokens) - 1 for e in valid[:100])
            rows.append((task, tr, va))
            total += (min(args.ahead, len(train)) * tr + min(100, len(valid)) * va) * per_token
        print(f"{name}: {per_token:,} bytes of keys and values per token")
        print(f"  mean prefix length over {len(rows)} tasks: {statistics.mean(r[1] for r in rows):.1f} (training), "
              f"{statistics.mean(r[2] for r in rows):.1f} (valid)")  # fmt: skip
        for task, tr, va in rows:
            print(f"  {task}: {tr:.1f} / {va:.1f}")
        print(f"  {len(rows)} tasks in one fit: {total / 1e9:.2f} GB of prefixes ({args.ahead} steps ahead + valid)")


if __name__ == "__main__":
    main()
