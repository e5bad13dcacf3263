"""Robustness of adapters and the model caches.

A damaged, edited or foreign adapter gives one clear ``AdapterError``; adapters
are read with safetensors + JSON only; a cache entry that does not match its
source, or whose weights file is damaged, is rebuilt rather than used.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import site_lens.adapter as io_mod
from site_lens.adapter import CFG_FILE, WEIGHTS_FILE, Adapter, AdapterError, load_adapter, save_adapter
from site_lens.models import hf, model_identity, weight_cache
from site_lens.models.engines import HOOKED

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _adapter(model, **meta) -> Adapter:
    c = model.cfg
    g = torch.Generator().manual_seed(0)
    return Adapter(
        t=torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g),
        theta=torch.randn(c.n_layers, c.n_heads, generator=g),
        model=model_identity(model),
        meta={"task": "x", "seed": 0, **meta},
    )


@pytest.fixture
def saved(model, tmp_path) -> Path:
    return save_adapter(_adapter(model), tmp_path / "ad")


def _edit_cfg(folder: Path, edit) -> None:
    cfg = json.loads((folder / CFG_FILE).read_text())
    edit(cfg)
    (folder / CFG_FILE).write_text(json.dumps(cfg))


def _replace_tensors(folder: Path, tensors: dict, keep_digest: bool = False) -> None:
    """Write other tensors; drop the recorded digest unless told (as an old or hand-made adapter)."""
    save_file(tensors, str(folder / WEIGHTS_FILE))
    if not keep_digest:
        _edit_cfg(folder, lambda c: c.pop("weights_sha256", None))


def _expect(folder: Path, message: str, identity=None) -> None:
    with pytest.raises(AdapterError, match=message) as e:
        load_adapter(folder, identity)
    msg = str(e.value)
    assert "\n" not in msg and e.value.__cause__ is None
    assert str(folder) in msg or "adapter was made for model" in msg


def _t(model, dtype=torch.float32):
    c = model.cfg
    return torch.zeros(c.n_layers, c.n_heads, c.d_head, dtype=dtype), torch.zeros(c.n_layers, c.n_heads, dtype=dtype)


# each case: (id, how to damage a saved adapter folder, expected message)
DAMAGE = [
    ("weights-empty", lambda f, m: (f / WEIGHTS_FILE).write_bytes(b""), "unreadable safetensors"),
    ("weights-garbage", lambda f, m: (f / WEIGHTS_FILE).write_bytes(b"\x00" * 64), "unreadable safetensors"),
    (
        "weights-huge-header",
        lambda f, m: (f / WEIGHTS_FILE).write_bytes((2**62).to_bytes(8, "little") + b"{}"),
        "unreadable",
    ),
    ("weights-text", lambda f, m: (f / WEIGHTS_FILE).write_text("not tensors"), "unreadable safetensors"),
    ("weights-pickle", lambda f, m: torch.save({"t": _t(m)[0]}, f / WEIGHTS_FILE), "unreadable safetensors"),
    ("weights-missing", lambda f, m: (f / WEIGHTS_FILE).unlink(), "missing from the adapter folder"),
    ("weights-folder", lambda f, m: ((f / WEIGHTS_FILE).unlink(), (f / WEIGHTS_FILE).mkdir()), "missing"),
    ("cfg-missing", lambda f, m: (f / CFG_FILE).unlink(), "missing from the adapter folder"),
    ("cfg-empty", lambda f, m: (f / CFG_FILE).write_text(""), "not valid JSON"),
    ("cfg-truncated", lambda f, m: (f / CFG_FILE).write_text((f / CFG_FILE).read_text()[:40]), "not valid JSON"),
    ("cfg-binary", lambda f, m: (f / CFG_FILE).write_bytes(b"\xff\xfe\x00"), "not valid JSON"),
    ("cfg-deep", lambda f, m: (f / CFG_FILE).write_text("[" * 100_000), "not valid JSON"),
    ("cfg-huge-int", lambda f, m: (f / CFG_FILE).write_text("9" * 5000), "not valid JSON"),
    ("cfg-list", lambda f, m: (f / CFG_FILE).write_text("[]"), "not a site-lens-adapter/2 config"),
    (
        "cfg-other-format",
        lambda f, m: _edit_cfg(f, lambda c: c.update(format="site-lens-adapter/9")),
        "not a site-lens",
    ),
    ("cfg-no-model", lambda f, m: _edit_cfg(f, lambda c: c.pop("model")), "not a site-lens"),
    ("cfg-model-string", lambda f, m: _edit_cfg(f, lambda c: c.update(model="tiny")), "not a site-lens"),
    ("cfg-meta-list", lambda f, m: _edit_cfg(f, lambda c: c.update(meta=[1])), "'meta' must be an object"),
    ("cfg-more-heads", lambda f, m: _edit_cfg(f, lambda c: c["model"].update(n_heads=99)), "shape"),
    ("cfg-layers-string", lambda f, m: _edit_cfg(f, lambda c: c["model"].update(n_layers="2")), "shape"),
    ("cfg-no-shape", lambda f, m: _edit_cfg(f, lambda c: c["model"].pop("d_head")), "shape"),
    (
        "weights-replaced",
        lambda f, m: _replace_tensors(f, dict(zip(("t", "theta"), _t(m))), keep_digest=True),
        "SHA-256",
    ),
    ("digest-edited", lambda f, m: _edit_cfg(f, lambda c: c.update(weights_sha256="0" * 64)), "SHA-256"),
    ("float16", lambda f, m: _replace_tensors(f, dict(zip(("t", "theta"), _t(m, torch.float16)))), "float32"),
    ("bfloat16", lambda f, m: _replace_tensors(f, dict(zip(("t", "theta"), _t(m, torch.bfloat16)))), "float32"),
    ("float64", lambda f, m: _replace_tensors(f, dict(zip(("t", "theta"), _t(m, torch.float64)))), "float32"),
    ("int-tensors", lambda f, m: _replace_tensors(f, dict(zip(("t", "theta"), _t(m, torch.int64)))), "float32"),
    ("bool-theta", lambda f, m: _replace_tensors(f, {"t": _t(m)[0], "theta": _t(m, torch.bool)[1]}), "float32"),
    (
        "extra-tensor",
        lambda f, m: _replace_tensors(f, {**dict(zip(("t", "theta"), _t(m))), "bias": torch.zeros(1)}),
        "found",
    ),
    ("missing-theta", lambda f, m: _replace_tensors(f, {"t": _t(m)[0]}), "expected tensors 't' and 'theta'"),
    ("renamed", lambda f, m: _replace_tensors(f, dict(zip(("T", "theta"), _t(m)))), "expected tensors"),
    (
        "transposed-t",
        lambda f, m: _replace_tensors(f, {"t": _t(m)[0].transpose(0, 2).contiguous(), "theta": _t(m)[1]}),
        "shape",
    ),
    ("flat-theta", lambda f, m: _replace_tensors(f, {"t": _t(m)[0], "theta": _t(m)[1].flatten()}), "shape"),
    ("scalar-theta", lambda f, m: _replace_tensors(f, {"t": _t(m)[0], "theta": torch.zeros(())}), "shape"),
    ("nan-theta", lambda f, m: _replace_tensors(f, {"t": _t(m)[0], "theta": _t(m)[1] + float("nan")}), "non-finite"),
    ("inf-t", lambda f, m: _replace_tensors(f, {"t": _t(m)[0] - float("inf"), "theta": _t(m)[1]}), "non-finite"),
]


@pytest.mark.parametrize("damage, message", [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damaged_adapter_gives_one_clear_error(model, saved, damage, message):
    damage(saved, model)
    _expect(saved, message)


def test_missing_folder_and_file_in_place_of_folder(tmp_path):
    _expect(tmp_path / "nothing", "adapter folder not found")
    (tmp_path / "file").write_text("x")
    _expect(tmp_path / "file", "adapter folder not found")


@FAST
@given(data=st.data())
def test_any_truncation_or_header_byte_change_is_refused(model, saved, data):
    """Every cut of the file, and every changed byte in its header or data, gives AdapterError."""
    w = saved / WEIGHTS_FILE
    good = w.read_bytes()
    try:
        if data.draw(st.booleans(), "truncate"):
            w.write_bytes(good[: data.draw(st.integers(0, len(good) - 1), "cut")])
        else:
            i = data.draw(st.integers(0, len(good) - 1), "byte")
            b = data.draw(st.integers(0, 255).filter(lambda b: b != good[i]), "value")
            w.write_bytes(good[:i] + bytes([b]) + good[i + 1 :])
        with pytest.raises(AdapterError) as e:
            load_adapter(saved)
        assert "\n" not in str(e.value)
    finally:
        w.write_bytes(good)


def test_adapter_from_another_model_is_refused(model, saved):
    from helpers import tiny

    ident = model_identity(model)
    for other in (
        tiny(n_heads=2, n_key_value_heads=1),
        tiny(d_model=64),
        tiny(n_layers=3),
        tiny(d_head=4, rotary_dim=4),
    ):
        with pytest.raises(AdapterError, match="adapter was made for model"):
            load_adapter(saved, model_identity(other))
    changed = [
        {"architecture": "GPT2LMHeadModel"},
        {"d_vocab": ident["d_vocab"] + 1},
        {"processing": {**ident["processing"], "fold_value_biases": True}},
    ]
    for change in changed:
        _expect(saved, next(iter(change)), {**ident, **change})
    # the same shapes from another source file (another checkpoint of one architecture)
    _edit_cfg(saved, lambda c: c["model"].update(source_sha256="a" * 64))
    _expect(saved, "source_sha256", {**ident, "source_sha256": "b" * 64})
    assert load_adapter(saved, {**ident, "source_sha256": "a" * 64}).model["source_sha256"] == "a" * 64


def test_adapters_are_read_without_pickle(model, saved, monkeypatch):
    src = inspect.getsource(io_mod)
    assert "import pickle" not in src and "pickle.load" not in src and "torch.load(" not in src

    def refuse(*a, **k):
        raise AssertionError("pickle used while loading an adapter")

    for mod, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(mod, name, refuse)
    a = load_adapter(saved, model_identity(model))
    assert torch.equal(a.theta, _adapter(model).theta)


def test_adapter_without_recorded_digest_still_loads(model, saved):
    """Adapters written before the digest was recorded keep loading."""
    _edit_cfg(saved, lambda c: c.pop("weights_sha256"))
    assert torch.equal(load_adapter(saved).t, _adapter(model).t)


def test_interrupted_save_keeps_the_old_adapter(model, saved, monkeypatch):
    """A save that fails midway leaves the previous adapter intact and no temp folders."""
    before = load_adapter(saved)

    import safetensors.torch

    def boom(tensors, filename, *a, **k):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_adapter(_adapter(model, task="new"), saved)
    monkeypatch.undo()
    after = load_adapter(saved)
    assert after.meta == before.meta and torch.equal(after.t, before.t)
    assert sorted(p.name for p in saved.parent.iterdir()) == ["ad"]


# ---------------------------------------------------------------- the weight cache


@pytest.fixture
def cache_entry(model, tmp_path):
    """A tiny model written as a cache entry under a fake source digest."""
    entry = tmp_path / "tiny-0123456789abcdef-v1"
    weight_cache.save(entry, model, "f" * 64)
    assert (entry / weight_cache.META_FILE).is_file() and (entry / weight_cache.WEIGHTS_FILE).is_file()
    return entry


@dataclass(frozen=True)
class Cache:
    """A model cache as the damage tests see it: the weight cache (HookedTransformer models) or the transformers
    cache (``load_hf_model`` and the bridge)."""

    meta: str
    weights: str
    version_key: str
    tokenizer: tuple[str, ...]  # what a lost tokenizer takes with it
    config: str  # the file the model's config is read from

    def write(self, tmp_path: Path) -> tuple[Path, Any]:
        """A tiny model written as an entry under a fake source digest, and a function of tokens giving its
        logits."""
        entry = tmp_path / "tiny-0123456789abcdef-v1"
        if self is WEIGHT_CACHE:
            from helpers import tiny

            torch.manual_seed(0)
            model = tiny()
            weight_cache.save(entry, model, "f" * 64)
            return entry, model
        from helpers import char_tokenizer

        from site_lens.models.tiny import tiny_hf

        model = tiny_hf("llama", char_tokenizer())
        assert hf._save_hf(entry, model, char_tokenizer(), "f" * 64)
        return entry, lambda tokens: model(tokens).logits

    def load(self, entry: Path, digest: str = "f" * 64) -> Any:
        """The entry's model as a function of tokens giving logits, or None where the cache refuses it."""
        if self is WEIGHT_CACHE:
            return weight_cache.load(entry, digest, "cpu", torch.float32)
        loaded = hf._load_cached(entry, digest, torch.float32, None)
        return None if loaded is None else (lambda tokens: loaded[0](tokens).logits)


WEIGHT_CACHE = Cache(weight_cache.META_FILE, weight_cache.WEIGHTS_FILE, "cache_version", ("tokenizer",), "meta.json")
HF_CACHE = Cache(hf.HF_META, hf.HF_WEIGHTS, "version", ("tokenizer.json", "tokenizer_config.json"), "config.json")
# the weight cache holds HookedTransformer models, which TransformerLens 4 removed
CACHES = {"weights": WEIGHT_CACHE, "transformers": HF_CACHE} if HOOKED is not None else {"transformers": HF_CACHE}


@pytest.fixture(params=sorted(CACHES))
def cache(request):
    return CACHES[request.param]


def test_a_cache_entry_loads_back_exactly(cache, tmp_path):
    entry, model = cache.write(tmp_path)
    loaded = cache.load(entry)
    assert loaded is not None
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.equal(loaded(tokens), model(tokens))


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _rewrite_meta(entry: Path, cache: Cache, edit) -> None:
    meta = json.loads((entry / cache.meta).read_text())
    edit(meta)
    (entry / cache.meta).write_text(json.dumps(meta))


def _resave(path: Path, change) -> None:
    from safetensors.torch import load_file

    save_file({k: change(v) for k, v in load_file(str(path)).items()}, str(path))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _remove(entry: Path, names) -> None:
    for n in names:
        p = entry / n
        shutil.rmtree(p) if p.is_dir() else p.unlink()


CACHE_DAMAGE = [  # (name, damage(entry, cache), digest asked for)
    ("digest-mismatch", lambda e, c: None, "e" * 64),
    ("version-mismatch", lambda e, c: _rewrite_meta(e, c, lambda m: m.update({c.version_key: 0})), None),
    ("no-fingerprint", lambda e, c: _rewrite_meta(e, c, lambda m: m.pop("weights")), None),
    ("meta-garbage", lambda e, c: (e / c.meta).write_text("{"), None),
    ("meta-missing", lambda e, c: (e / c.meta).unlink(), None),
    ("config-garbage", lambda e, c: (e / c.config).write_text("{"), None),
    ("weights-missing", lambda e, c: (e / c.weights).unlink(), None),
    ("weights-truncated", lambda e, c: _truncate(e / c.weights), None),
    ("weights-empty", lambda e, c: (e / c.weights).write_bytes(b""), None),
    ("weights-header-byte", lambda e, c: _flip(e / c.weights, 20), None),
    ("weights-length-byte", lambda e, c: _flip(e / c.weights, 7), None),
    ("weights-appended", lambda e, c: (e / c.weights).open("ab").write(b"\x00" * 8), None),
    ("weights-other-model", lambda e, c: save_file({"embed.W_E": torch.zeros(3, 3)}, str(e / c.weights)), None),
    ("weights-float16", lambda e, c: _resave(e / c.weights, lambda v: v.half()), None),  # only the fingerprint sees it
    ("tokenizer-missing", lambda e, c: _remove(e, c.tokenizer), None),
]


@pytest.mark.parametrize("damage, digest", [d[1:] for d in CACHE_DAMAGE], ids=[d[0] for d in CACHE_DAMAGE])
def test_damaged_or_stale_cache_is_rebuilt_not_used(cache, tmp_path, damage, digest, caplog):
    entry, _ = cache.write(tmp_path)
    assert cache.load(entry) is not None  # whole, it is used: the damage is what refuses it
    damage(entry, cache)
    with caplog.at_level("WARNING", logger="site_lens.models"):
        assert cache.load(entry, digest or "f" * 64) is None
    if (entry / cache.meta).exists():
        assert "rebuilding" in caplog.text


def test_load_hf_model_rebuilds_a_damaged_entry_and_keeps_a_whole_one(tmp_path, monkeypatch, caplog):
    """``load_hf_model`` of an embedded model: the first load builds the entry, a damaged entry is rebuilt (with a
    warning), a whole one is used as it is; dequantising stands in for a tiny model here."""
    from helpers import char_tokenizer

    from site_lens.models import embedded
    from site_lens.models.tiny import tiny_hf

    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"not really a GGUF")
    built = []

    def dequantise(gguf, dtype=torch.float32, **kwargs):
        built.append(gguf)
        return tiny_hf("llama", char_tokenizer()).to(dtype), char_tokenizer()

    monkeypatch.setitem(embedded.EMBEDDED_MODELS, "tiny", SimpleNamespace(gguf_parts=lambda: [source]))
    monkeypatch.setattr(hf, "join_gguf", lambda parts, path: parts[0])
    monkeypatch.setattr(hf, "hf_from_gguf", dequantise)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    want = tiny_hf("llama", char_tokenizer())(tokens).logits
    first, _ = hf.load_hf_model("tiny", cache_dir=tmp_path / "cache")
    (entry,) = (tmp_path / "cache").iterdir()
    assert len(built) == 1 and torch.equal(first(tokens).logits, want)
    _flip(entry / HF_CACHE.weights, 20)
    with caplog.at_level("WARNING", logger="site_lens.models"):
        again, _ = hf.load_hf_model("tiny", cache_dir=tmp_path / "cache")
    assert len(built) == 2 and "damaged or replaced; rebuilding" in caplog.text
    assert torch.equal(again(tokens).logits, want)
    cached, _ = hf.load_hf_model("tiny", cache_dir=tmp_path / "cache")
    assert len(built) == 2 and torch.equal(cached(tokens).logits, want)  # the rebuilt entry, used
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entry.name]  # no temp or aside left


def test_cache_fingerprint_records_size_and_header(cache_entry):
    meta = json.loads((cache_entry / weight_cache.META_FILE).read_text())
    w = cache_entry / weight_cache.WEIGHTS_FILE
    data = w.read_bytes()
    n = int.from_bytes(data[:8], "little")
    assert meta["source_sha256"] == "f" * 64
    assert meta["weights"] == {"bytes": len(data), "header_sha256": hashlib.sha256(data[8 : 8 + n]).hexdigest()}


def test_an_entry_written_meanwhile_is_kept_an_older_one_replaced(model, cache_entry):
    """Two processes building one model: the second keeps the first's entry; one from before its own look is stale."""
    import time

    meta = cache_entry / weight_cache.META_FILE
    written = meta.stat().st_mtime
    inode = meta.stat().st_ino
    weight_cache.save(cache_entry, model, "f" * 64, since=written - 60)  # the entry appeared after this one looked
    assert meta.stat().st_ino == inode  # theirs, untouched
    weight_cache.save(cache_entry, model, "e" * 64, since=written - 60)  # another source's entry: replaced
    assert json.loads(meta.read_text())["source_sha256"] == "e" * 64
    inode = meta.stat().st_ino
    weight_cache.save(cache_entry, model, "e" * 64, since=time.time() + 60)  # older than the look: replaced
    assert meta.stat().st_ino != inode
    assert sorted(p.name for p in cache_entry.parent.iterdir()) == [cache_entry.name]  # no temp or aside left


def test_unwritable_cache_does_not_stop_loading(model, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level("WARNING", logger="site_lens.models.weight_cache"):
        weight_cache.save(blocker / "entry", model, "f" * 64)
    assert "could not write the weight cache" in caplog.text
