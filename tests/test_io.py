import json

import pytest
import torch

from site_lens.adapter import Adapter, AdapterError, load_adapter, save_adapter
from site_lens.experiments.run import predict, predict_with_logits
from site_lens.models import model_identity


def _adapter(model):
    c = model.cfg
    return Adapter(
        t=torch.randn(c.n_layers, c.n_heads, c.d_head),
        theta=torch.randn(c.n_layers, c.n_heads),
        model=model_identity(model),
        meta={"task": "x", "seed": 0},
    )


def test_round_trip_gives_identical_outputs(model, tmp_path):
    a = _adapter(model)
    save_adapter(a, tmp_path / "ad")
    b = load_adapter(tmp_path / "ad", model_identity(model))
    assert torch.equal(a.t, b.t) and torch.equal(a.theta, b.theta) and b.meta == a.meta
    assert predict(model, ["cat", "dog"], a) == predict(model, ["cat", "dog"], b)
    prompts = ["Q: cat\nA:", "Q: dog\nA:"]
    assert torch.equal(predict_with_logits(model, prompts, a)[1], predict_with_logits(model, prompts, b)[1])


def test_mismatched_model_is_refused(model, tmp_path):
    from helpers import tiny

    save_adapter(_adapter(model), tmp_path / "ad")
    other = tiny(n_layers=3)
    with pytest.raises(AdapterError, match="n_layers"):
        load_adapter(tmp_path / "ad", model_identity(other))
    ident = model_identity(model)
    ident["processing"] = {**ident["processing"], "fold_ln": True}
    with pytest.raises(AdapterError, match="processing"):
        load_adapter(tmp_path / "ad", ident)


def test_corrupt_adapters_give_clear_errors(model, tmp_path):
    save_adapter(_adapter(model), tmp_path / "ad")
    w = tmp_path / "ad" / "adapter.safetensors"
    data = w.read_bytes()
    w.write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="unreadable safetensors"):
        load_adapter(tmp_path / "ad")
    save_adapter(_adapter(model), tmp_path / "ad")
    (tmp_path / "ad" / "cfg.json").write_text("{oops")
    with pytest.raises(AdapterError, match="not valid JSON"):
        load_adapter(tmp_path / "ad")
    save_adapter(_adapter(model), tmp_path / "ad")
    cfg = json.loads((tmp_path / "ad" / "cfg.json").read_text())
    cfg["model"]["n_heads"] += 1
    (tmp_path / "ad" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(AdapterError, match="shape"):
        load_adapter(tmp_path / "ad")
    (tmp_path / "ad" / "cfg.json").unlink()
    with pytest.raises(AdapterError, match="missing"):
        load_adapter(tmp_path / "ad")
    with pytest.raises(AdapterError, match="not found"):
        load_adapter(tmp_path / "nothing")


def test_site_config_round_trips_and_fills_missing_parts():
    from site_lens.config import ConfigError, EmbeddingConfig, EvalConfig, SelectionConfig, SiteConfig

    cfg = SiteConfig(
        seed=3, embedding=EmbeddingConfig(n_shots=4), selection=SelectionConfig(steps=9), eval=EvalConfig(max_test=None)
    )
    back = SiteConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and isinstance(back.embedding, EmbeddingConfig)
    # a saved config from before a part or a field existed, or with a null part: defaults fill it
    assert SiteConfig.from_dict({"seed": 1, "embedding": None, "selection": {"steps": 9}}) == SiteConfig(
        seed=1, selection=SelectionConfig(steps=9)
    )
    with pytest.raises(ConfigError, match=r"SiteConfig: unknown keys \['shots'\]"):
        SiteConfig.from_dict({"shots": 3})
    with pytest.raises(ConfigError, match=r"EmbeddingConfig: unknown keys \['shots'\]"):
        SiteConfig.from_dict({"embedding": {"shots": 3}})
    # a part given as its config is kept; anything but a config, a dict or null is refused at once
    assert SiteConfig.from_dict({"embedding": EmbeddingConfig(n_shots=4)}).embedding.n_shots == 4
    with pytest.raises(ConfigError, match="EvalConfig.from_dict needs a dict, got int"):
        SiteConfig.from_dict({"eval": 3})


def test_site_config_reads_fast_and_backend_saved_under_selection():
    """Configs saved when the engine's two fields sat in SelectionConfig load with them in EngineConfig."""
    from site_lens.config import ConfigError, EngineConfig, SelectionConfig, SiteConfig

    old = {"seed": 2, "selection": {"steps": 9, "fast": False, "backend": "hooked"}}
    assert SiteConfig.from_dict(old) == SiteConfig(
        seed=2, selection=SelectionConfig(steps=9), engine=EngineConfig(fast=False, backend="hooked")
    )
    assert old["selection"]["fast"] is False  # the caller's dict is left as it was
    with pytest.raises(ConfigError, match=r"\['backend'\] given in both selection and engine"):
        SiteConfig.from_dict({"selection": {"backend": "hooked"}, "engine": {"backend": "packed"}})
    with pytest.raises(ConfigError, match="EngineConfig.backend must be auto, hooked or packed, got 'gpu'"):
        SiteConfig.from_dict({"engine": {"backend": "gpu"}})
    with pytest.raises(ConfigError, match=r"SelectionConfig: unknown keys \['fast'\]"):
        SelectionConfig.from_dict({"fast": True})  # the stage-2 config alone has no engine field
