import pytest
import torch
from helpers import needs_hooked

from site_lens.experiments.run import predict
from site_lens.models import ModelError, load_model, model_identity
from site_lens.models.convert import fast_layout, finalize
from site_lens.models.tiny import build_cfg, tiny_model
from site_lens.stages.generation import generate_greedy
from site_lens.tokens import PromptTooLongError


def test_unknown_model_is_one_line_error():
    with pytest.raises(ModelError, match="unknown model 'nope'") as e:
        load_model("nope")
    assert "\n" not in str(e.value)


def test_the_hooked_engine_where_transformer_lens_has_none_is_one_line_error():
    """TransformerLens 4 removed HookedTransformer: asking for it names the way out, before any loading; on 3.x
    it is the default engine."""
    from site_lens.models.engines import HOOKED, check_engine, default_engine, hooked_class

    if HOOKED is not None:
        assert check_engine("hooked") == "hooked" == default_engine() and hooked_class() is HOOKED
        return
    assert default_engine() == "bridge"
    for ask in (lambda: load_model("smollm2-135m", engine="hooked"), hooked_class):
        with pytest.raises(ModelError, match="TransformerLens 3.x .*removed in 4.0.*bridge") as e:
            ask()
        assert "\n" not in str(e.value)


def test_unknown_dtype():
    with pytest.raises(ModelError, match="unknown dtype"):
        load_model("smollm2-135m", dtype="float7")


def test_prompt_longer_than_context(model):
    with pytest.raises(PromptTooLongError, match="exceeds the model's context of 64"):
        predict(model, ["x" * 80])
    with pytest.raises(PromptTooLongError):
        generate_greedy(model, [[1] * 60], max_new_tokens=10)


def test_identity_records_shape_and_flags(model):
    ident = model_identity(model)
    assert ident["n_layers"] == 2 and ident["n_heads"] == 4 and ident["processing"]["fold_value_biases"] is False


@needs_hooked("build_cfg makes a HookedTransformerConfig")
def test_build_cfg_overrides():
    assert build_cfg(n_layers=5).n_layers == 5


@needs_hooked("finalize and fast_layout act on a converted HookedTransformer")
def test_finalize_moves_dtype_and_keeps_the_fast_layout():
    """What the first load of an embedded model in bfloat16 does to the converted float32 model."""
    model = finalize(tiny_model(), "cpu", torch.bfloat16)
    assert model.cfg.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    strides = [p.stride() for p in model.parameters()]
    fast_layout(model)  # already in the fast layout: nothing moves
    assert strides == [p.stride() for p in model.parameters()]


def test_join_gguf_survives_a_concurrent_join(tmp_path, monkeypatch):
    """Two processes joining the same parts at once each finish with the whole file."""
    import shutil

    from site_lens import locks
    from site_lens.models import convert

    parts = []
    for i, data in enumerate([b"abc" * 1000, b"xyz" * 1000]):
        parts.append(tmp_path / f"part{i}")
        parts[-1].write_bytes(data)
    joined = tmp_path / "cache" / "model.gguf"
    copy, calls = shutil.copyfileobj, []

    def racing_copy(src, dst, length=0):  # the other process joins while this one is half-way
        calls.append(1)
        if len(calls) == 1:
            convert.join_gguf(parts, joined)
        copy(src, dst, length)

    monkeypatch.setattr(convert.shutil, "copyfileobj", racing_copy)
    joined.parent.mkdir()
    orphan = joined.parent / f".model.gguf.{locks._HOST}.{2**22 + 7}.dead.tmp"  # a pid above any pid_max: gone
    orphan.write_bytes(b"half")
    assert convert.join_gguf(parts, joined) == joined
    assert joined.read_bytes() == b"abc" * 1000 + b"xyz" * 1000
    assert [p.name for p in joined.parent.iterdir()] == ["model.gguf"]  # no temp left behind, the orphan removed
