"""A first load's dequantisation: transformers reading the GGUF file as it does, against ``hf_from_gguf``.

transformers builds a ``gguf.GGUFReader``, which parses every header field (the vocabulary included), for the
config, again for the tokenizer and again for the weights; ``site_lens.models.convert.hf_from_gguf`` has one
reader per file serve all three. For each embedded model, the two ways are timed in turn, ``--reps`` times,
interleaved and in alternating order (so the machine's drift and a first run's warm-up fall on both), from the
joined GGUF file to a float32 ``transformers`` model and tokenizer; the readers each way builds are counted.
Medians, and their ratio. The weight cache is not involved: this is what the first load of a model costs before
it writes the cache.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gguf_load.py --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gguf
import torch

from site_lens.models.convert import hf_from_gguf, join_gguf
from site_lens.models.embedded import EMBEDDED_MODELS

READS: list[str] = []
_MAKE = gguf.GGUFReader


def _counted(path, *args, **kwargs):
    READS.append(str(path))
    return _MAKE(path, *args, **kwargs)


gguf.GGUFReader = _counted  # count every reader built, by either way


def as_transformers_reads(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model, tok


WAYS = {"transformers": as_transformers_reads, "hf_from_gguf": hf_from_gguf}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=sorted(EMBEDDED_MODELS))
    args = ap.parse_args()
    print(f"{torch.get_num_threads()} thread(s), {args.reps} reps, interleaved; seconds from GGUF file to model")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = join_gguf(EMBEDDED_MODELS[name].gguf_parts(), Path(tmp) / f"{name}.gguf")
            times: dict[str, list[float]] = {w: [] for w in WAYS}
            reads: dict[str, int] = {}
            for rep in range(args.reps):
                for way in list(WAYS)[:: 1 if rep % 2 == 0 else -1]:
                    load = WAYS[way]
                    READS.clear()
                    t0 = time.perf_counter()
                    model, tok = load(path)
                    times[way].append(time.perf_counter() - t0)
                    reads[way] = len(READS)
                    del model, tok
            med = {w: statistics.median(t) for w, t in times.items()}
            for way in WAYS:
                runs = " ".join(f"{t:.1f}" for t in times[way])
                print(f"{name:<14} {way:<13} readers built {reads[way]}  median {med[way]:6.1f} s  ({runs})")
            print(f"{name:<14} ratio transformers / hf_from_gguf: {med['transformers'] / med['hf_from_gguf']:.2f}")


if __name__ == "__main__":
    main()
