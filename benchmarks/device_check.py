"""Both backends and the Hugging Face path on an accelerator, against the float32 CPU reference.

    .venv/bin/python benchmarks/device_check.py --device cuda --out results/checks/device_check.json

For each embedded model, with a task embedding of uppercase and a seeded random gate:

* **last-token logits** of 32 training prompts (``PromptCache``, as SITE's training step uses)
  on the device with the hooked and the packed backend, against the hooked backend on CPU
  (max |difference| over the largest |logit|);
* **the sequence loss** (``SequenceCache``) on the device, both backends, against CPU;
* **greedy generations** of 50 prompts (8 new tokens, injected at prefill) on the device with
  each backend: how many equal the CPU's token for token;
* **training-step time**: the median of 30 batch-1 first-token steps (forward and backward to
  theta) on the device with each backend and on CPU with the packed one;
* **the bridge engine** (TransformerBridge): on the device, last-token logits, generations and the
  training-step time as above; then split by ``load_model(..., engine="bridge", device_map=...)``
  with the first half of the layers (and the embedding, final norm and unembedding) on the device
  and the second half on the CPU: a SITE step (t and alpha follow each layer's device) and how many
  of the 50 generations equal the CPU's;
* **the Hugging Face path** (``site_lens.models.hf``) dispatched by accelerate with the first half of
  the layers (and the embedding, final norm and unembedding) on the device and the second half on
  the CPU: once run there, so activations cross devices both ways, and once offloaded
  (accelerate's default for such a map: the CPU layers' weights stream to the device); where the
  layers' weights are, and how many of the 50 generations equal the TransformerLens CPU path's
  (batched and one by one).

On a fresh machine run ``make venv`` first; the first load of each model dequantises its GGUF
(about a minute for both).

Each part's result (or its error) is written to ``--out`` as it finishes. ``--device cpu`` runs
the same checks on CPU (a dry run of the script; the HF split map then has nothing to split).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import traceback
from pathlib import Path

import torch

import site_lens as sl
from site_lens.adapter import Adapter
from site_lens.engine.backend import backend_for
from site_lens.engine.prompt_cache import PromptCache
from site_lens.gate import injection_hooks
from site_lens.models import hf, model_identity
from site_lens.stages.embeddings import build_task_embedding
from site_lens.stages.generation import generate_greedy
from site_lens.stages.objectives import SequenceCache, objective_examples
from site_lens.tasks import format_query
from site_lens.tokens import encode


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1.0))


def synced(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gate(model) -> tuple[torch.Tensor, torch.Tensor]:
    """(t, theta): uppercase's task embedding (10 five-shot prompts) and a seeded random theta, on CPU."""
    task = sl.load_task("uppercase")
    shots = "".join(f"{format_query(x)} {y}\n\n" for x, y in task.train[:5])
    t = build_task_embedding(model, encode(model, [shots + format_query(x) for x, _ in task.train[5:15]]))
    theta = torch.randn(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(0))
    return t.float().cpu(), theta


def prompts(n: int) -> list[str]:
    items = [x for k in ("uppercase", "first-letter", "opposites", "next-number") for x, _ in sl.load_task(k).test]
    return [format_query(x) for x in random.Random(0).sample(items, n)]


def logits_of(cache: PromptCache, n: int, alpha, t) -> torch.Tensor:
    out = torch.empty(n, cache.model.cfg.d_vocab)
    with torch.no_grad():
        for idx, logits in cache.logits(range(n), alpha, t):
            out[idx] = logits.float().cpu()
    return out


def step_seconds(cache: PromptCache, theta: torch.Tensor, t: torch.Tensor, steps: int, device: str) -> float:
    theta = theta.clone().to(device).requires_grad_(True)
    times = []
    for i in range(steps + 3):  # three warm-up steps
        synced(device)
        t0 = time.perf_counter()
        loss = cache.loss([i % len(cache)], torch.sigmoid(theta), t)
        loss.backward()
        synced(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
        theta.grad = None
    return statistics.median(times)


def tl_checks(name: str, device: str, report: dict) -> None:
    cpu = sl.load_model(name)
    cpu.requires_grad_(False)
    t, theta = gate(cpu)
    alpha = torch.sigmoid(theta)
    texts = prompts(50)
    toks = encode(cpu, texts)
    base, _ = generate_greedy(
        cpu, toks, max_new_tokens=8, prefill_hooks=lambda last: injection_hooks(cpu, t, alpha, last)
    )
    report["_tl"] = (cpu, t, theta, texts, base)  # the HF part's reference, whatever fails below
    dev = sl.load_model(name, device=device)
    dev.requires_grad_(False)
    t_dev, alpha_dev = t.to(device), alpha.to(device)
    task = sl.load_task("uppercase")
    first = objective_examples(cpu, task, "train", "first_token")[:32]
    seq = objective_examples(cpu, task, "train", "sequence")[:16]
    want = logits_of(PromptCache(cpu, first, backend=backend_for(cpu, "hooked")), len(first), alpha, t)
    with torch.no_grad():
        want_seq = float(SequenceCache(cpu, seq, backend=backend_for(cpu, "hooked")).loss(range(len(seq)), alpha, t))
    report |= {"logits_rel_err": {}, "sequence_loss": {"cpu_hooked": want_seq}, "generations_equal_to_cpu": {}}
    report["step_s"] = {}
    for kind in ("hooked", "packed"):
        try:  # one backend failing (the packed one's probe, say) leaves the other's figures
            be = backend_for(dev, kind)
            cache = PromptCache(dev, first, backend=be)
            report["logits_rel_err"][kind] = rel_err(logits_of(cache, len(first), alpha_dev, t_dev), want)
            with torch.no_grad():
                got = float(SequenceCache(dev, seq, backend=be).loss(range(len(seq)), alpha_dev, t_dev))
            report["sequence_loss"][f"{device}_{kind}"] = got
            gen, _ = generate_greedy(
                dev,
                toks,
                max_new_tokens=8,
                prefill_hooks=lambda last: injection_hooks(dev, t_dev, alpha_dev, last),
                backend=kind,
            )
            report["generations_equal_to_cpu"][kind] = f"{sum(a == b for a, b in zip(gen, base))} of {len(base)}"
            report["step_s"][f"{device}_{kind}"] = step_seconds(cache, theta, t_dev, 30, device)
        except Exception:  # a check script: record the failure and go on
            report[f"{kind}_error"] = traceback.format_exc(limit=8)
    cpu_packed = PromptCache(cpu, first, backend=backend_for(cpu, "packed"))
    report["step_s"]["cpu_packed_reference"] = step_seconds(cpu_packed, theta, t, 30, "cpu")


def split_map(name: str, device: str) -> dict[str, str]:
    """First half of the layers (and everything but the layers) on ``device``, the second half on the CPU."""
    model, _ = hf.load_hf_model(name)
    n = len(model.model.layers)
    device_map = {f"model.{k}": device for k, _ in model.model.named_children() if k != "layers"}
    device_map |= {f"model.layers.{i}": device if i < n // 2 else "cpu" for i in range(n)}
    device_map["lm_head"] = device  # tied to the embedding on both models: kept with it
    return device_map


def bridge_checks(name: str, device: str, tl: tuple, report: dict) -> None:
    """The bridge engine on the device, and split between the device and the CPU by a device_map."""
    cpu, t, theta, texts, base = tl
    alpha = torch.sigmoid(theta)
    task = sl.load_task("uppercase")
    first = objective_examples(cpu, task, "train", "first_token")[:32]
    want = logits_of(PromptCache(cpu, first, backend=backend_for(cpu, "hooked")), len(first), alpha, t)
    toks = encode(cpu, texts)
    rep = report.setdefault("bridge", {})
    for placement in ("device", "split"):
        try:
            if placement == "device":
                model = sl.load_model(name, engine="bridge", device=device)
            else:
                model = sl.load_model(name, engine="bridge", device_map=split_map(name, device))
                rep["split_devices"] = sorted({str(p.device) for p in model.parameters()})
            dev = next(model.parameters()).device
            t_dev, alpha_dev = t.to(dev), alpha.to(dev)
            cache = PromptCache(model, first, backend=backend_for(model))
            rep[f"{placement}_backend"] = backend_for(model).reason
            rep[f"{placement}_logits_rel_err"] = rel_err(logits_of(cache, len(first), alpha_dev, t_dev), want)
            gen, _ = generate_greedy(
                model,
                toks,
                max_new_tokens=8,
                prefill_hooks=lambda last, m=model: injection_hooks(m, t_dev, alpha_dev, last),
            )
            rep[f"{placement}_generations_equal_to_cpu"] = f"{sum(a == b for a, b in zip(gen, base))} of {len(base)}"
            rep[f"{placement}_step_s"] = step_seconds(cache, theta, t_dev, 30, device)
            del model
        except Exception:  # a check script: record the failure and go on
            rep[f"{placement}_error"] = traceback.format_exc(limit=8)


def hf_checks(name: str, device: str, tl: tuple, report: dict) -> None:
    """Two placements: layers split between the device and the CPU (main_device="cpu", so the CPU
    layers run on the CPU and activations cross devices), and accelerate's default for the same map,
    which offloads the CPU layers' weights and runs every layer on the device."""
    from accelerate import dispatch_model

    cpu, t, theta, texts, base = tl
    adapter = Adapter(t=t, theta=theta, model=model_identity(cpu))
    for placement, main in (("split", "cpu"), ("offload", None)):
        model, tok = hf.load_hf_model(name)
        n = len(model.model.layers)
        device_map = {f"model.{k}": device for k, _ in model.model.named_children() if k != "layers"}
        device_map |= {f"model.layers.{i}": device if i < n // 2 else "cpu" for i in range(n)}
        device_map["lm_head"] = device  # tied to the embedding on both models: kept with it
        model = dispatch_model(model, device_map=device_map, main_device=main)
        rep = report.setdefault(f"hf_{placement}", {})
        rep["weight_devices"] = sorted({str(p.device) for m in hf.output_projections(model) for p in m.parameters()})
        for bs in (16, 1):
            t0 = time.perf_counter()
            got = hf.generate(model, tok, texts, adapter, max_new_tokens=8, batch_size=bs, return_tokens=True)
            rep[f"batch{bs}_equal_to_tl_cpu"] = f"{sum(a == b for a, b in zip(got, base))} of {len(base)}"
            rep[f"batch{bs}_s"] = time.perf_counter() - t0
        del model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    ap.add_argument("--out", default="results/checks/device_check.json")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": args.device, "torch": torch.__version__}
    if args.device.startswith("cuda"):
        result["device_name"] = torch.cuda.get_device_name(0)

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    for name in args.models.split(","):
        rep: dict = {}
        result[name] = rep
        for part, fn in (
            ("tl", lambda: tl_checks(name, args.device, rep)),
            ("bridge", lambda: bridge_checks(name, args.device, rep["_tl"], rep)),
            ("hf", lambda: hf_checks(name, args.device, rep["_tl"], rep)),
        ):
            t0 = time.perf_counter()
            try:
                fn()
            except Exception:  # a check script: record the failure and go on
                rep[f"{part}_error"] = traceback.format_exc(limit=8)
                if part == "tl":
                    break
            finally:
                rep[f"{part}_seconds"] = time.perf_counter() - t0
                save_rep = {k: v for k, v in rep.items() if k != "_tl"}
                result[name] = save_rep
                save()
                result[name] = rep
        rep.pop("_tl", None)
        result[name] = rep
        save()
        print(json.dumps({name: rep}, indent=1, default=str), flush=True)


if __name__ == "__main__":
    main()
