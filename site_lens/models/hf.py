"""SITE adapters on plain Hugging Face models: ``transformers``' own ``generate``, ``device_map``, any dtype.

With the unprocessed weights site-lens loads, ``hook_z`` flattened over heads is
exactly the input of each layer's attention output projection (``self_attn.o_proj``
in Llama and Gemma 3, ``attn.c_proj`` in GPT-2), the place the paper's own code
hooks. ``inject`` adds a forward pre-hook to each of them that mixes

    z[b, p_b, h] <- (1 - alpha[l, h]) * z[b, p_b, h] + alpha[l, h] * t[l, h]

at each row's last prompt token p_b (the last 1 of its attention mask, so left or
right padding) in every forward pass that starts with an empty cache: the prefill
of ``model.generate``, or a plain forward. Decode steps, whose cache already holds
the prompt, are left alone, so no generated token is injected, as in site-lens's
own generation (``gate.Injection``, the rule every path reads). t and alpha are moved to each layer's device and dtype (a
``device_map`` that splits the model, a layer kept in another dtype).

    model, tok = load_hf_model("smollm2-135m")         # or any transformers causal LM you loaded
    adapter = load_adapter("runs/demo/uppercase/adapter")
    print(generate(model, tok, ["Q: bright\\nA:"], adapter))
    ids = torch.tensor(encode(tok, ["Q: bright\\nA:"]))
    with inject(model, adapter):                       # around your own generate call
        out = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=sorted(stop_ids(tok)))

Prompts must be tokenised as site-lens tokenises them (``encode``: with the BOS token first
wherever the tokenizer has one, as TransformerLens's tokenizer does), or the adapter meets
inputs it was not trained on.

Generation stops at the tokens site-lens's own generation stops at (``stop_ids``):
every token whose text holds a newline (the end of an answer in the ``Q: x\\nA: y``
format), and the pad / end-of-sequence token.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..adapter import Adapter, AdapterError
from ..files import write_dir
from ..gate import AlphaGate, Injection
from ..tokens import tokenizer_pad_id, tokenizer_stop_ids
from .convert import PROCESSING_FLAGS, hf_architecture, hf_from_gguf, join_gguf
from .identity import hf_name, hf_weights_digest, output_projections, record_source, source_of
from .weight_cache import fingerprint, source_digest

__all__ = ["encode", "generate", "hf_identity", "inject", "load_hf_model", "output_projections", "stop_ids"]

log = logging.getLogger(__name__)

HF_CACHE_VERSION = 1


# ---------------------------------------------------------------- loading


HF_META = "site_lens.json"  # version, source digest, the weights file's size and header hash
HF_WEIGHTS = "model.safetensors"
HF_NEEDED = ("config.json", "tokenizer_config.json")  # beside the weights: what from_pretrained reads first


def _entry_problem(entry: Path, digest: str) -> str | None:
    """Why the transformers cache entry cannot be used for the source ``digest`` (None: it can), as the weight
    cache judges its own: metadata that matches, a weights file of the recorded size and header, its files there."""
    if not entry.exists():
        return "absent"
    try:
        meta = json.loads((entry / HF_META).read_text())
    except (OSError, ValueError):
        return f"{HF_META} is missing or unreadable"
    if meta.get("source_sha256") != digest or meta.get("version") != HF_CACHE_VERSION:
        return "it does not match its source"
    if "weights" not in meta:
        return "it was written without a record of its weights file (by an older site-lens)"
    try:
        if meta.get("weights") != fingerprint(entry / HF_WEIGHTS):
            return f"{HF_WEIGHTS} is damaged or replaced"
    except OSError:
        return f"{HF_WEIGHTS} is missing"
    missing = [f for f in HF_NEEDED if not (entry / f).is_file()]
    return f"{', '.join(missing)} missing" if missing else None


def _written_since(entry: Path, digest: str, since: float) -> bool:
    """Whether ``entry`` is a usable entry for ``digest`` whose metadata was written at or after ``since``."""
    try:
        return _entry_problem(entry, digest) is None and (entry / HF_META).stat().st_mtime >= since
    except OSError:
        return False


def _load_cached(entry: Path, digest: str, dtype: torch.dtype, device_map: Any, **kwargs: Any) -> tuple | None:
    """(model, tokenizer) from the cache entry, or None when it is absent, stale or damaged (a warning unless
    absent: the caller rebuilds it). The entry's own files are judged before the caller's arguments meet them, so
    a bad ``device_map`` or keyword raises as it would anywhere, leaving the entry alone."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    problem = _entry_problem(entry, digest)
    if problem is None:
        try:
            config, tok = AutoConfig.from_pretrained(str(entry)), AutoTokenizer.from_pretrained(str(entry))
        except Exception as e:  # a config or tokenizer file damaged since it was written
            problem = f"unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    if problem is not None:
        if problem != "absent":
            log.warning("transformers cache %s: %s; rebuilding", entry, problem)
        return None
    model = AutoModelForCausalLM.from_pretrained(str(entry), config=config, dtype=dtype, device_map=device_map, **kwargs)
    return model, tok


def _save_hf(entry: Path, model: Any, tokenizer: Any, digest: str, since: float | None = None) -> bool:
    """A transformers checkpoint folder in the cache, atomically; False (with a warning) if it cannot be written.

    ``since``: when the caller found no usable entry (``time.time()``). A usable entry for ``digest`` written
    after that, by another process building the same model, is kept; anything else there is replaced.
    """
    # the weights as dequantised: a plain float32 checkpoint (GGUF-loaded models refuse save_pretrained)
    from safetensors.torch import save_model

    def fill(tmp: Path) -> None:
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        save_model(model, str(tmp / HF_WEIGHTS), metadata={"format": "pt"})
        tokenizer.save_pretrained(str(tmp))
        meta = {"version": HF_CACHE_VERSION, "source_sha256": digest, "weights": fingerprint(tmp / HF_WEIGHTS)}
        (tmp / HF_META).write_text(json.dumps(meta))

    try:
        write_dir(entry, fill, keep=lambda e: since is not None and _written_since(e, digest, since))
        return True
    except OSError as e:
        log.warning("could not write the HF model cache at %s: %s", entry, e)
        return False


def load_hf_model(
    name: str = "smollm2-135m",
    *,
    dtype: torch.dtype = torch.float32,
    device_map: str | dict[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """(model, tokenizer) from ``transformers``: an embedded model (no network) or any hub name.

    An embedded model is dequantised from its GGUF once, then kept as a float32 checkpoint in the
    weight cache (``models.default_cache_dir()``), so later loads take seconds. ``device_map``
    and ``kwargs`` go to ``AutoModelForCausalLM.from_pretrained``. The model is in eval mode, frozen.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .embedded import EMBEDDED_MODELS, default_cache_dir

    if name in EMBEDDED_MODELS:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        parts = EMBEDDED_MODELS[name].gguf_parts()
        digest = source_digest(parts)
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        entry = cache / f"{name}-{digest[:16]}-hf-v{HF_CACHE_VERSION}"
        looked = time.time()
        loaded = _load_cached(entry, digest, dtype, device_map, **kwargs)
        if loaded is not None:
            model, tok = loaded
        else:
            gguf = join_gguf(parts, cache / f"{name}-{digest[:16]}.gguf")
            log.info("dequantising %s for transformers (first load; later loads use the cache)", gguf.name)
            fresh, tok = hf_from_gguf(gguf)
            saved = _save_hf(entry, fresh, tok, digest, since=looked)  # another process's entry from meanwhile is kept
            del fresh
            if saved:
                model = AutoModelForCausalLM.from_pretrained(str(entry), dtype=dtype, device_map=device_map, **kwargs)
                tok = AutoTokenizer.from_pretrained(str(entry))
            else:  # no cache: dequantise again, straight onto the asked dtype and devices
                model, _ = hf_from_gguf(gguf, dtype, device_map=device_map, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, device_map=device_map, **kwargs)
        tok = AutoTokenizer.from_pretrained(name)
        digest = None
    record_source(model, name, digest)
    return model.eval().requires_grad_(False), tok


def _text_config(model: Any) -> Any:
    c = model.config
    return c.get_text_config() if hasattr(c, "get_text_config") else c


def hf_identity(model: Any) -> dict[str, Any]:
    """What an adapter must match (``adapter.MATCH_KEYS``), read from the HF config; HF weights are unprocessed."""

    c = _text_config(model)
    n_heads = getattr(c, "num_attention_heads", None) or c.n_head
    d_model = getattr(c, "hidden_size", None) or c.n_embd
    known = source_of(model)
    return {
        "name": hf_name(model),
        "revision": getattr(model.config, "_commit_hash", None),
        "architecture": hf_architecture(model),
        "n_layers": getattr(c, "num_hidden_layers", None) or c.n_layer,
        "n_heads": n_heads,
        "d_head": getattr(c, "head_dim", None) or d_model // n_heads,
        "d_model": d_model,
        "d_vocab": c.vocab_size,
        "source_sha256": known.get("source_sha256"),
        "weights_sha256": hf_weights_digest(model),
        "processing": dict.fromkeys(PROCESSING_FLAGS, False),
    }


# ---------------------------------------------------------------- injecting


def _past_length(kwargs: dict[str, Any]) -> int:
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    return int(cache[0][0].shape[-2]) if len(cache) else 0  # legacy tuple caches


@contextlib.contextmanager
def inject(model: Any, adapter: Adapter, *, check: bool = True) -> Iterator[None]:
    """Inject ``adapter`` at each row's last prompt token in every prefill forward of ``model`` inside the block.

    ``check`` refuses an adapter made for another model (``hf_identity`` against its record).
    A forward pass "starts with an empty cache" when it is given none or an empty one, so
    ``generate`` must keep its cache (the default): with ``use_cache=False`` (or a chunked
    prefill) every pass would count as a prefill and be injected again.
    """
    if check:
        adapter.check_model(hf_identity(model))
    projs = output_projections(model)
    n_layers, n_heads, d_head = adapter.t.shape
    if len(projs) != n_layers:
        raise AdapterError(f"adapter has {n_layers} layers, this model {len(projs)}")
    t_all, alpha = adapter.t.detach(), adapter.alpha.detach()
    state: dict[str, Any] = {"injection": None, "start": 0}  # the running forward's Injection, its first position
    moved: dict[tuple[int, torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    signature = inspect.signature(model.forward)

    def start(module, args, kwargs):
        try:
            kwargs = {**signature.bind_partial(*args, **kwargs).arguments, **kwargs}  # positional ones by name
        except TypeError:
            pass
        x = kwargs.get("input_ids")
        x = x if x is not None else kwargs.get("inputs_embeds")
        past = _past_length(kwargs)
        if x is None:
            state["injection"] = None
            return
        n = x.shape[1]
        mask = kwargs.get("attention_mask")
        if past > 0:  # a decode step: the prompt, its last token too, is in the cache
            at: Tensor | int = past - 1
        elif isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[1] == n:
            at = n - 1 - mask.ne(0).flip(1).int().argmax(1)  # the last 1 of each row
        else:
            at = torch.full((x.shape[0],), n - 1, dtype=torch.long)
        state["injection"], state["start"] = Injection(t_all, alpha, at), past

    def stop(module, args, output):
        state["injection"] = None

    def mix(layer, module, args):
        injection = state["injection"]
        pos = None if injection is None else injection.where(state["start"])  # None: not in this forward
        if pos is None:
            return None
        x = args[0]  # (batch, pos, head * d_head)
        key = (layer, x.device, x.dtype)
        if key not in moved:
            t, a = injection.layer(layer)
            moved[key] = (t.to(x.device, x.dtype), a[:, None].to(x.device, x.dtype))
        t, a = moved[key]  # (head, d_head), (head, 1)
        rows = torch.arange(x.shape[0], device=x.device)
        p = pos.to(x.device)
        z = x[rows, p].view(-1, n_heads, d_head)
        x = x.clone()
        x[rows, p] = AlphaGate.mix(z, t, a).reshape(-1, n_heads * d_head)
        return (x, *args[1:])

    handles = [
        model.register_forward_pre_hook(start, with_kwargs=True),
        model.register_forward_hook(stop, always_call=True),
    ]
    handles += [p.register_forward_pre_hook(lambda m, a, i=i: mix(i, m, a)) for i, p in enumerate(projs)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# ---------------------------------------------------------------- generating


def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids as site-lens's TransformerLens models give them: BOS first wherever the tokenizer has one."""
    bos = tokenizer.bos_token_id
    out = []
    for t in texts:
        ids = list(tokenizer(t)["input_ids"])
        out.append([bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids)
    return out


def stop_ids(tokenizer: Any) -> set[int]:
    """The ids generation stops at, as in site-lens's own generation: newline tokens, and the pad / EOS token."""
    return tokenizer_stop_ids(tokenizer)


@torch.inference_mode()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    adapter: Adapter | None = None,
    *,
    max_new_tokens: int = 20,
    batch_size: int = 16,
    return_tokens: bool = False,
) -> list[str] | list[list[int]]:
    """Greedy generations with ``model.generate`` (left-padded batches), SITE injected if an adapter is given.

    Prompts are strings (tokenised by ``encode``, as site-lens tokenises them) or token ids. Each generation
    ends at its first stop token (``stop_ids``), kept as site-lens's own generation keeps it;
    strings are decoded, or token ids with ``return_tokens``.
    """
    from transformers import GenerationConfig

    ids = [encode(tokenizer, [p])[0] if isinstance(p, str) else list(p) for p in prompts]
    stops = stop_ids(tokenizer)
    pad = tokenizer_pad_id(tokenizer)
    gen_cfg = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(stops), pad_token_id=pad
    )
    device = next(model.parameters()).device
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    outs: list[list[int]] = [[] for _ in ids]
    ctx = inject(model, adapter) if adapter is not None else contextlib.nullcontext()
    with ctx:
        for s in range(0, len(order), batch_size):
            part = order[s : s + batch_size]
            n = max(len(ids[i]) for i in part)
            tokens = torch.full((len(part), n), pad, dtype=torch.long)
            mask = torch.zeros((len(part), n), dtype=torch.long)
            for j, i in enumerate(part):  # left padding: every row's prompt ends at the same place
                tokens[j, n - len(ids[i]) :] = torch.tensor(ids[i])
                mask[j, n - len(ids[i]) :] = 1
            out = model.generate(input_ids=tokens.to(device), attention_mask=mask.to(device), generation_config=gen_cfg)
            for j, i in enumerate(part):
                new = out[j, n:].tolist()
                cut = next((k for k, tok in enumerate(new) if tok in stops), len(new) - 1)
                outs[i] = new[: cut + 1]
    if return_tokens:
        return outs
    return [tokenizer.decode(o) for o in outs]
