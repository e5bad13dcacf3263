"""SITE adapters on plain Hugging Face models agree with the TransformerLens path: a HookedTransformer converted
from the same weights on TransformerLens 3.x, a TransformerBridge around a copy of them on 4.x."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from helpers import char_tokenizer

from site_lens.adapter import Adapter, AdapterError
from site_lens.gate import injection_hooks
from site_lens.models import hf, model_identity
from site_lens.models.convert import ModelError
from site_lens.models.engines import HOOKED
from site_lens.stages.generation import generate_greedy
from site_lens.tokens import encode, generation_stop_ids


def _tiny_hf(seed: int = 0, layers: int = 3):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok.get_vocab()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    return model, tok


def _adapter(tl, seed: int = 0) -> Adapter:
    c = tl.cfg
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g)
    theta = 2 * torch.randn(c.n_layers, c.n_heads, generator=g)
    return Adapter(t=t, theta=theta, model=model_identity(tl))


PROMPTS = ["Q: cold\nA:", "Q: a\nA:", "Q: bright river\nA:", "Q: 42\nA:", "Q: x y z w\nA:"]


def _transformer_lens(model, tok):
    """The TransformerLens engine of these weights: HookedTransformer's conversion, or (TransformerLens 4) a
    TransformerBridge around a copy, so hooks that ``hf.inject`` puts on ``model`` never reach it."""
    if HOOKED is not None:
        from site_lens.models.convert import hooked_from_hf

        return hooked_from_hf(model, tok)
    from site_lens.models.bridge import bridge_from_hf

    bridge = bridge_from_hf(copy.deepcopy(model), char_tokenizer())
    bridge.cfg.default_prepend_bos = False  # the character tokenizer has no BOS: strings encoded as they are
    return bridge


@pytest.fixture(scope="module")
def pair():
    model, tok = _tiny_hf()
    return model, tok, _transformer_lens(model, tok)


def _tl_logits(tl, ids, adapter):
    out = []
    for row in ids:
        hooks = injection_hooks(tl, adapter.t, adapter.alpha, len(row) - 1)
        with tl.hooks(fwd_hooks=hooks):
            out.append(tl(torch.tensor([row]))[0])
    return out


def _double(v):
    if torch.is_tensor(v) and v.is_floating_point():
        return v.double()
    if isinstance(v, tuple):
        return tuple(_double(x) for x in v)
    return v


def _to_float64(module, args, kwargs):
    """A decoder layer kept in float64 inside a float32 model: its inputs cast on the way in."""
    return _double(args), {k: _double(v) for k, v in kwargs.items()}


def _to_float32(module, args, out):
    return out.float() if torch.is_tensor(out) else (out[0].float(), *out[1:])


@pytest.mark.parametrize("side", ["left", "right"])
def test_injected_forward_matches_transformer_lens_with_either_padding(pair, side):
    model, tok, tl = pair
    adapter = _adapter(tl)
    ids = encode(tl, PROMPTS)
    batch = tok.pad({"input_ids": ids}, padding=True, padding_side=side, return_tensors="pt")
    with hf.inject(model, adapter):
        logits = model(**batch).logits
    plain = model(**batch).logits  # the hooks are gone after the block
    for j, (row, want) in enumerate(zip(ids, _tl_logits(tl, ids, adapter))):
        where = batch["attention_mask"][j].bool()
        got = logits[j][where]
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (side, j, (got - want).abs().max())
        assert not torch.allclose(plain[j][where][-1], want[-1], atol=1e-3)  # the injection changed something
        assert torch.allclose(got[:-1], plain[j][where][:-1], atol=1e-5)  # only the last prompt token is written


def test_generate_injects_at_prefill_only_and_matches_transformer_lens(pair):
    model, tok, tl = pair
    adapter = _adapter(tl, seed=1)
    ids = encode(tl, PROMPTS)
    for bs in (1, 3, 16):
        got = hf.generate(model, tok, PROMPTS, adapter, max_new_tokens=8, batch_size=bs, return_tokens=True)
        want, _ = generate_greedy(
            tl, ids, max_new_tokens=8, prefill_hooks=lambda last: injection_hooks(tl, adapter.t, adapter.alpha, last)
        )
        assert got == want, bs
    zero = hf.generate(model, tok, PROMPTS, None, max_new_tokens=8, return_tokens=True)
    assert zero == generate_greedy(tl, ids, max_new_tokens=8)[0]
    assert zero != got


def test_encode_and_stop_ids_are_site_lens_own(pair):
    _, tok, tl = pair
    assert hf.encode(tok, PROMPTS) == encode(tl, PROMPTS)
    assert hf.stop_ids(tok) == generation_stop_ids(tl)
    assert tok("\n")["input_ids"][0] in hf.stop_ids(tok)


def test_an_adapter_for_another_model_is_refused(pair):
    model, _, tl = pair
    other, _ = _tiny_hf(layers=2)
    with pytest.raises(AdapterError, match="n_layers"), hf.inject(other, _adapter(tl)):
        pass
    bad = _adapter(tl)
    bad.model = {**bad.model, "processing": {**bad.model["processing"], "fold_ln": True}}
    with pytest.raises(AdapterError, match="processing"), hf.inject(model, bad):
        pass
    assert hf.hf_identity(model)["architecture"] == model_identity(tl)["architecture"] == "LlamaForCausalLM"


def test_a_model_without_known_output_projections_is_refused():
    with pytest.raises(ModelError, match="output projections"):
        hf.output_projections(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_t_and_alpha_follow_each_layers_dtype_and_a_split_device_map(pair, tmp_path):
    """One layer kept in float64, and a device_map that offloads layers to disk (the CPU's split map)."""
    from accelerate import dispatch_model

    model, tok, tl = pair
    adapter = _adapter(tl, seed=2)
    ids = encode(tl, PROMPTS)
    batch = tok.pad({"input_ids": ids}, padding=True, padding_side="left", return_tensors="pt")
    with hf.inject(model, adapter):
        want = model(**batch).logits

    mixed, _ = _tiny_hf()
    layer = mixed.model.layers[1].to(torch.float64)
    seen = []
    layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    to64 = layer.register_forward_pre_hook(_to_float64, with_kwargs=True)
    back = layer.register_forward_hook(_to_float32)
    with hf.inject(mixed, adapter):
        got = mixed(**batch).logits
    to64.remove()
    back.remove()
    assert torch.float64 in seen
    assert torch.allclose(got, want, atol=1e-4)

    split, _ = _tiny_hf()
    device_map = {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.layers.2": "disk",
        "model.norm": "cpu",
        "lm_head": "cpu",
    }
    split = dispatch_model(split, device_map=device_map, offload_dir=str(tmp_path / "offload"))
    with hf.inject(split, adapter):
        got = split(**batch).logits
    assert torch.allclose(got, want, atol=1e-5)


# ---------------------------------------------------------------- the embedded models


def _prompts(n: int = 50) -> list[str]:
    from site_lens.tasks import format_query, load_task

    rng = random.Random(0)
    items = [x for name in ("uppercase", "first-letter", "opposites", "next-number") for x, _ in load_task(name).test]
    return [format_query(x) for x in rng.sample(items, n)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma-3-270m"])
def test_embedded_models_agree_with_transformer_lens(name, request):
    from site_lens.stages.embeddings import build_task_embedding
    from site_lens.tasks import format_query, load_task

    tl = request.getfixturevalue({"smollm2-135m": "smollm", "gemma-3-270m": "gemma"}[name])  # load_model(name)
    model, tok = hf.load_hf_model(name)
    task = load_task("uppercase")
    shots = "".join(f"{format_query(x)} {y}\n\n" for x, y in task.train[:5])
    t = build_task_embedding(tl, encode(tl, [shots + format_query(x) for x, _ in task.train[5:15]]))
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(tl.cfg.n_layers, tl.cfg.n_heads, generator=g)
    adapter = Adapter(t=t, theta=theta, model=model_identity(tl))
    prompts = _prompts()
    ids = encode(tl, prompts)
    # the injected step's logits, one prompt at a time (no padding)
    for row, want in list(zip(ids, _tl_logits(tl, ids[:8], adapter)))[:8]:
        with hf.inject(model, adapter):
            got = model(torch.tensor([row])).logits[0]
        assert torch.allclose(got[-1], want[-1], atol=2e-3, rtol=1e-3), (got[-1] - want[-1]).abs().max()
    want, _ = generate_greedy(
        tl, ids, max_new_tokens=8, prefill_hooks=lambda last: injection_hooks(tl, adapter.t, adapter.alpha, last)
    )
    for bs, n in ((16, len(prompts)), (1, 16)):  # batched (padded) on all 50, one at a time on the first 16
        got = hf.generate(model, tok, prompts[:n], adapter, max_new_tokens=8, batch_size=bs, return_tokens=True)
        same = sum(a == b for a, b in zip(got, want[:n], strict=True))
        assert same >= n - 1, (bs, same, [(a, b) for a, b in zip(got, want) if a != b][:3])  # one may differ
    moved = Adapter(t=t, theta=theta, model={**adapter.model, "source_sha256": "0" * 64})  # other weights
    with pytest.raises(AdapterError, match="source_sha256"), hf.inject(model, moved):
        pass


@pytest.mark.slow
def test_predict_cli_with_the_hf_engine(tmp_path, capsys):
    from site_lens.adapter import save_adapter
    from site_lens.cli import main
    from site_lens.models import load_model
    from site_lens.stages.embeddings import build_task_embedding
    from site_lens.tasks import format_query, load_task

    tl = load_model("smollm2-135m")
    task = load_task("uppercase")
    shots = "".join(f"{format_query(x)} {y}\n\n" for x, y in task.train[:5])
    t = build_task_embedding(tl, encode(tl, [shots + format_query(x) for x, _ in task.train[5:15]]))
    save_adapter(Adapter(t=t, theta=torch.full(t.shape[:2], 2.0), model=model_identity(tl)), tmp_path / "adapter")
    words = [x for x, _ in task.test[:12]]
    (tmp_path / "in.txt").write_text("\n".join(words))
    lines = {}
    for engine in ("transformer-lens", "hf"):
        argv = [
            "predict",
            "--adapter",
            str(tmp_path / "adapter"),
            "--input",
            str(tmp_path / "in.txt"),
            "--engine",
            engine,
        ]
        assert main([*argv, "--max-new-tokens", "6"]) == 0
        lines[engine] = capsys.readouterr().out.splitlines()
    assert len(lines["hf"]) == len(words)
    assert sum(a == b for a, b in zip(lines["hf"], lines["transformer-lens"])) >= len(words) - 1, lines
    assert main(["predict", "--adapter", str(tmp_path / "adapter"), "--engine", "hf", "--dtype", "float33"]) == 2
    assert "unknown dtype" in capsys.readouterr().err
