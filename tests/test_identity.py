"""Model identity: registered flags for site-lens's own models, flags read off any other model."""

import copy
import gc

import pytest
import torch
from helpers import needs_hooked

from site_lens.adapter import Adapter, AdapterError
from site_lens.models.convert import PROCESSING_FLAGS, ModelError, new_hooked
from site_lens.models.identity import detect_processing, model_identity, register
from site_lens.models.tiny import build_cfg, tiny_model

hooked = needs_hooked("weight-processing detection reads its weights")

# a GPT-2-like LayerNorm model (the default tiny model is Llama-like: RMS, rotary, GQA)
LN = dict(
    normalization_type="LN",
    positional_embedding_type="standard",
    final_rms=False,
    gated_mlp=False,
    act_fn="gelu",
    n_key_value_heads=None,
)
DEFAULTS = dict(fold_ln=True, center_writing_weights=True, center_unembed=True)  # TL's from_pretrained defaults


def _with_biases(model, names=("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U")):
    g = torch.Generator().manual_seed(1)
    for n, p in model.named_parameters():
        if n.rsplit(".", 1)[-1] in names:
            p.data = 0.1 * torch.randn(p.shape, generator=g)
    return model


def _adapter(model, **processing):
    c = model.cfg
    return Adapter(
        t=torch.zeros(c.n_layers, c.n_heads, c.d_head),
        theta=torch.zeros(c.n_layers, c.n_heads),
        model=model_identity(model, processing or None),
    )


@hooked
def test_unprocessed_models_report_no_processing():
    for kw in ({}, LN):
        assert model_identity(tiny_model(**kw))["processing"] == PROCESSING_FLAGS
        assert detect_processing(new_hooked(build_cfg(**kw))) == PROCESSING_FLAGS  # unregistered: read off it


@hooked
def test_processed_rms_model_shows_its_flags():
    """TL 3.9 folds RMSNorm (-> RMSPre) and centres W_U, but never centres an RMS model's writing weights."""
    model = tiny_model()
    model.process_weights_(**DEFAULTS)  # TL 3.9's process_weights_ always folds value biases too
    flags = model_identity(model)["processing"]
    assert model.cfg.normalization_type == "RMSPre"
    assert flags == {**PROCESSING_FLAGS, "fold_ln": True, "center_unembed": True}
    # asked-for steps TL skips here (centring an RMS model, folding absent value biases) are reported False
    asked = model_identity(model, {**DEFAULTS, "fold_value_biases": True})["processing"]
    assert asked == flags


@hooked
def test_processed_layernorm_model_shows_its_flags():
    model = tiny_model(**LN)
    model.process_weights_(**DEFAULTS)
    assert model_identity(model)["processing"] == {**PROCESSING_FLAGS, **DEFAULTS}
    one = tiny_model(**LN)
    one.process_weights_(fold_ln=False, center_writing_weights=False, center_unembed=True)
    assert model_identity(one)["processing"] == {**PROCESSING_FLAGS, "center_unembed": True}


@hooked
def test_user_built_model_is_read_not_assumed():
    """The bug: a model site-lens did not load was reported unprocessed whatever it was."""
    model = new_hooked(build_cfg(**LN))
    model.process_weights_(**DEFAULTS)
    ident = model_identity(model)
    assert ident["processing"]["fold_ln"] and ident["processing"]["center_writing_weights"]
    assert ident["name"] == model.cfg.model_name and ident["source_sha256"] is None


@hooked
@pytest.mark.parametrize("seed", range(8))
def test_random_weights_do_not_look_centred(seed):
    """d_model 32: a random row's mean is ~0.2 of its rms, far from the rounding a centred row shows."""
    for kw in ({}, LN):
        d = detect_processing(new_hooked(build_cfg(seed=seed, **kw)))
        assert not (d["center_writing_weights"] or d["center_unembed"] or d["refactor_factored_attn_matrices"])


@hooked
def test_centring_is_seen_to_float_precision_only():
    model = new_hooked(build_cfg(**LN))
    w_u = model.unembed.W_U
    w_u.data = w_u.data - w_u.data.mean(-1, keepdim=True)
    assert detect_processing(model)["center_unembed"]
    w_u.data[:, 0] += 1e-3 * w_u.data.abs().max()  # statistically tiny, far above rounding
    assert not detect_processing(model)["center_unembed"]


@hooked
def test_adapters_from_folded_and_unfolded_models_do_not_mix():
    plain = tiny_model(**LN)
    folded = copy.deepcopy(plain)
    folded.process_weights_(**DEFAULTS)
    for made_on, used_on in ((folded, plain), (plain, folded)):
        _adapter(made_on).check_model(model_identity(made_on))
        with pytest.raises(AdapterError, match="processing"):
            _adapter(made_on).check_model(model_identity(used_on))


@hooked
def test_folded_value_biases_are_ambiguous_unless_told():
    model = _with_biases(tiny_model(**LN))
    assert model_identity(model)["processing"]["fold_value_biases"] is False  # non-zero b_V: not folded
    model.process_weights_(**DEFAULTS)  # folds b_V into b_O
    assert detect_processing(model)["fold_value_biases"] is None
    with pytest.raises(ModelError, match=r"fold_value_biases.*processing=\{") as e:
        model_identity(model)
    assert "\n" not in str(e.value)
    assert model_identity(model, {"fold_value_biases": True})["processing"] == {
        **PROCESSING_FLAGS,
        **DEFAULTS,
        "fold_value_biases": True,
    }
    register(model, "mine", processing={"fold_value_biases": True})  # once, for fit_site and friends
    assert model_identity(model)["processing"]["fold_value_biases"] is True
    with pytest.raises(ModelError, match="unknown processing flags"):
        model_identity(model, {"fold_lm": True})


@hooked
def test_caller_flags_override_detection():
    model = tiny_model(**LN)  # plain, but e.g. trained with LNPre: the caller knows better
    assert model_identity(model, {"fold_ln": True})["processing"]["fold_ln"] is True


@hooked
def test_load_model_registers_its_flags(monkeypatch):
    """A TransformerLens name: loaded with no processing; the registered flags settle what weights cannot."""
    from transformer_lens import HookedTransformer

    from site_lens import models

    fake = _with_biases(new_hooked(build_cfg(**LN)), names=("b_O",))  # b_V zero, b_O not: ambiguous by weight
    seen = {}

    def from_pretrained(name, **kwargs):
        seen.update(kwargs)
        return fake

    monkeypatch.setattr(HookedTransformer, "from_pretrained", from_pretrained)
    model = models.load_model("gpt2")
    assert {k: seen[k] for k in PROCESSING_FLAGS} == PROCESSING_FLAGS
    ident = model_identity(model)
    assert ident["name"] == "gpt2" and ident["processing"] == PROCESSING_FLAGS
    model.process_weights_(**DEFAULTS)  # processed since loading: read off the weights again
    assert model_identity(model, {"fold_value_biases": True})["processing"]["fold_ln"] is True


def test_identity_is_not_stored_on_the_model():
    """Either engine: the registry holds a model's identity beside it, and its entry goes with the model."""
    from helpers import char_tokenizer, tiny

    from site_lens.models.bridge import bridge_from_hf
    from site_lens.models.engines import is_bridge
    from site_lens.models.tiny import tiny_hf

    model = tiny()  # registered
    unregistered = (
        bridge_from_hf(tiny_hf("llama", char_tokenizer()), char_tokenizer())
        if is_bridge(model)
        else new_hooked(build_cfg())
    )
    before = set(vars(unregistered))
    assert model_identity(model)["name"]
    assert set(vars(model)) == before
    from site_lens.models import identity

    gc.collect()  # drop the entries of models other tests left behind
    n = len(identity._REGISTRY)
    del model
    gc.collect()
    assert len(identity._REGISTRY) == n - 1  # the entry went with its model


# ---------------------------------------------------------------- a TransformerBridge (either TransformerLens line)


def test_bridge_processing_is_read_off_its_state():
    """A bridge's raw weights report no processing; TransformerLens's compatibility mode reports its steps, and an
    adapter made on one does not load on the other."""
    from helpers import tiny_bridge_like

    raw, processed = tiny_bridge_like(), tiny_bridge_like()
    assert model_identity(raw)["processing"] == detect_processing(raw) == PROCESSING_FLAGS
    processed.enable_compatibility_mode()
    flags = model_identity(processed)["processing"]
    assert flags != PROCESSING_FLAGS and flags["center_unembed"] and not flags["refactor_factored_attn_matrices"]
    for made_on, used_on in ((raw, processed), (processed, raw)):
        _adapter(made_on).check_model(model_identity(made_on))
        with pytest.raises(AdapterError, match="processing"):
            _adapter(made_on).check_model(model_identity(used_on))


def test_bridge_caller_flags_override_and_nothing_is_stored_on_it():
    from helpers import tiny_bridge_like

    bridge = tiny_bridge_like()
    before = set(vars(bridge))
    assert model_identity(bridge, {"fold_ln": True})["processing"] == {**PROCESSING_FLAGS, "fold_ln": True}
    assert model_identity(bridge)["processing"] == PROCESSING_FLAGS  # the caller's flags were not kept
    assert set(vars(bridge)) == before
    with pytest.raises(ModelError, match="unknown processing flags"):
        model_identity(bridge, {"fold_lm": True})
