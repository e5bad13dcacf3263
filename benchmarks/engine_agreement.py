"""One adapter on every engine: SITE trained on HookedTransformer and on the TransformerBridge, each applied on
both engines and on plain transformers (``site_lens.models.hf``); greedy generations compared on 50 test prompts.

    .venv/bin/python benchmarks/engine_agreement.py smollm2-135m gemma-3-270m --data data/fv

For each pair of engines that disagree on a prompt, the first differing step's logit gap between the two
tokens is measured on the training engine (a near-tie is a gap under 0.1). Writes
results/engines/agreement.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from site_lens.engine.backend import last_logits
from site_lens.methods.site import fit_site
from site_lens.models import hf, load_model, model_identity
from site_lens.stages.generation import generate_greedy
from site_lens.tasks import format_query, load_task
from site_lens.tokens import encode


def _gap(model, adapter, prompt: list[int], common: list[int], a: int, b: int) -> float:
    """logit[a] - logit[b] after ``prompt + common`` with the adapter injected at the prompt's last token."""
    toks = torch.tensor([prompt + common])
    hooks = adapter.hooks(model, len(prompt) - 1)
    with torch.no_grad():
        logits = last_logits(model, toks, torch.tensor([toks.shape[1] - 1]), hooks=hooks)[0]
    return float(logits[a] - logits[b])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--data", required=True, help="the FV task folders")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--new", type=int, default=10, help="greedy tokens per prompt")
    ap.add_argument("--out", default="results/engines/agreement.json")
    args = ap.parse_args()
    task = load_task(args.task, data_dir=args.data)
    out: dict = {"task": args.task, "n": args.n, "max_new_tokens": args.new, "models": {}}
    for name in args.models:
        engines = {"hooked": load_model(name, engine="hooked"), "bridge": load_model(name, engine="bridge")}
        hf_model, tok = hf.load_hf_model(name)
        texts = [format_query(x) for x, _ in task.test[: args.n]]
        prompts = encode(engines["hooked"], texts)
        assert prompts == encode(engines["bridge"], texts), "the engines tokenize differently"
        rows = {}
        for trained_on, model in engines.items():
            t0 = time.perf_counter()
            adapter = fit_site(model, task).adapter
            fit_s = time.perf_counter() - t0
            gens = {}
            for engine, m in engines.items():
                adapter.check_model(model_identity(m))  # applies across engines, or raises
                gens[engine] = generate_greedy(
                    m, prompts, max_new_tokens=args.new, prefill_hooks=lambda last, m=m: adapter.hooks(m, last)
                )[0]
            adapter.check_model(hf.hf_identity(hf_model))
            gens["hf"] = hf.generate(hf_model, tok, prompts, adapter, max_new_tokens=args.new, return_tokens=True)
            ref = gens[trained_on]
            agree = {}
            for engine, got in gens.items():
                if engine == trained_on:
                    continue
                diffs = []
                for i, (a, b) in enumerate(zip(ref, got)):
                    if a == b:
                        continue
                    k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                    if k < min(len(a), len(b)):
                        gap = _gap(model, adapter, prompts[i], a[:k], a[k], b[k])
                    else:  # one stopped earlier (a stop token) where the other went on
                        gap = None
                    diffs.append({"prompt": i, "step": k, "gap": gap})
                agree[engine] = {"identical": len(ref) - len(diffs), "prompts": len(ref), "differences": diffs}
            rows[trained_on] = {"fit_seconds": round(fit_s, 1), "agreement": agree}
            for engine, a in agree.items():
                gaps = ", ".join("stop" if d["gap"] is None else f"{d['gap']:.3g}" for d in a["differences"])
                line = (
                    f"{name}: trained on {trained_on}, applied on {engine}: {a['identical']}/{a['prompts']} identical"
                )
                print(line + (f"; first-difference logit gaps: {gaps}" if gaps else ""))
        out["models"][name] = rows
        del engines, hf_model
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
