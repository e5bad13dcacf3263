"""Robustness of adapters.

A damaged, edited or foreign adapter gives one clear ``AdapterError``; adapters
are read with safetensors + JSON only. (The model caches: test_model_caches.py.)
"""

from __future__ import annotations

import inspect
import json
import pickle
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import site_lens.adapter as io_mod
from site_lens.adapter import CFG_FILE, WEIGHTS_FILE, Adapter, AdapterError, load_adapter, save_adapter
from site_lens.models import model_identity

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
