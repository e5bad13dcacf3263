"""The packed weights of a TransformerBridge (``packed_layer.PackedWeights``), read from the Hugging Face layout.

``LastToken``'s forward reads one ``packed_layer.PackedLayer`` per layer (Q/K/V
concatenated with the pre-norm's gain folded in, the output and MLP matrices
input-major, rotary tables, norms); ``pack_bridge`` builds the same record as
``hooked_pack.pack_hooked`` does, from the native transformers modules a bridge
wraps, with prefixes from the bridge's KV cache (keys already rotated, as
``LastToken`` keeps them). One packed model serves both model engines.

It covers Llama-style blocks (Llama, Mistral, Qwen2; Qwen3's per-head Q/K
norms; Phi-3's fused Q/K/V and gate/up matrices and partial rotary; GLM's
partial rotary over adjacent pairs) and Gemma 3 ((1 + w) norms, a norm after
each sublayer, a scaled embedding, sliding-window layers with their own rotary
base) in float32 or float64 on one device; ``backend.backend_for`` holds it to the bridge's own
forward on a probe prompt before using it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..models.engines import architecture
from .bridge_backend import BridgeBackend, cache_agrees
from .kernels import available as kernels_available
from .packed_layer import Norm, PackedLayer, PackedWeights, bias_or_none

# transformers architectures whose blocks pack_bridge packs (each held to the bridge by the probe as well)
PACKED_BRIDGE_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"}
    | {"Phi3ForCausalLM", "GlmForCausalLM"}
)
GEMMA = "Gemma3ForCausalLM"  # (1 + w) norms, a norm after each sublayer, a scaled embedding, sliding layers
ADJACENT = frozenset({"GlmForCausalLM"})  # rotary pairs (x0, x1), (x2, x3) ...; the others rotate the two halves
WINDOWED = frozenset({"Phi3ForCausalLM", "MistralForCausalLM"})  # config.sliding_window (where set): every layer


def _raw(module):
    """The transformers module a bridge component wraps (the module itself where it wraps none)."""
    return getattr(module, "_original_component", module)


def _params(hf_model) -> dict[str, Tensor]:
    """The model's parameters by their transformers names (the bridge's wrapper levels left out; a parameter its
    components share, such as Phi-3's fused Q/K/V under the bridge's ``qkv``, under every name)."""
    out: dict[str, Tensor] = {}
    for name, p in hf_model.named_parameters(remove_duplicate=False):
        out.setdefault(name.replace("._original_component", ""), p)
    return out


def _rope_types(hf_model) -> set[str]:
    """The rotary embedding's types ('default', 'llama3', 'yarn', 'dynamic', ...), one per layer type for Gemma 3."""
    rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
    kind = getattr(_raw(rotary), "rope_type", "default") if rotary is not None else "default"
    return set(kind.values()) if isinstance(kind, dict) else {kind}


def _activation(cfg) -> str:
    return getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")


def bridge_unsupported(bridge) -> str | None:
    """Why the packed model cannot run this bridge (None when it can, before the probe check); the check that runs
    the bridge (its KV cache against its forward) only where every other passes."""
    why = unpackable(bridge)
    if why is None and not cache_agrees(bridge):
        why = "the bridge's KV cache (which gives the prefixes) disagrees with its forward"
    return why


def unpackable(bridge) -> str | None:
    """What in the bridge's architecture, weights, dtype or devices the packed model does not cover (None: nothing;
    read from its config, nothing run)."""
    hf = bridge.original_model
    arch = architecture(bridge)
    cfg = hf.config
    devices = {str(d) for d in (getattr(hf, "hf_device_map", None) or {}).values()}
    checks = [
        (arch not in PACKED_BRIDGE_ARCHITECTURES, f"architecture {arch} is not one the packed path covers"),
        (not type(hf).__module__.startswith("transformers."), "the model's code is not transformers' own"),
        (
            bool(getattr(bridge, "compatibility_mode", False) or getattr(bridge, "_weights_processed", False)),
            "the bridge's weights are processed",
        ),
        (bool(_rope_types(hf) & {"dynamic", "longrope"}), "rotary scaling that depends on the sequence length"),
        (bridge.cfg.dtype not in (torch.float32, torch.float64), "dtype is not float32/float64"),
        (len(devices) > 1, "the model is split over devices"),
        (_activation(cfg) not in ("silu", "gelu", "gelu_pytorch_tanh"), "unknown activation"),
        (bool(getattr(cfg, "mlp_bias", False)), "the MLP has biases"),
        (
            arch != GEMMA and any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])),
            "sliding-window layers",
        ),
        (getattr(cfg, "attn_logit_softcapping", None) is not None, "attention soft cap"),
        (getattr(cfg, "final_logit_softcapping", None) is not None, "logit soft cap"),
    ]
    return next((why for bad, why in checks if bad), None)


def pack_bridge(bridge) -> PackedWeights:
    """A bridge's transformers weights packed for ``LastToken``; prefixes from the bridge's KV cache (keys rotated).

    Runs nothing: whether the bridge's KV cache agrees with its forward (``bridge_unsupported``) is decided before,
    once, by ``backend.backend_for``; what its config says the packed model does not cover is a ValueError here.
    """
    why = unpackable(bridge)
    if why is not None:
        raise ValueError(f"the packed model cannot run this bridge: {why}")
    hf = bridge.original_model
    cfg = hf.config
    arch = architecture(bridge)
    gemma, adjacent = arch == GEMMA, arch in ADJACENT
    offset = 1.0 if gemma else 0.0  # Gemma's RMSNorm multiplies by (1 + w)
    rows = kernels_available()
    p = _params(hf)
    rotary = _raw(hf.model.rotary_emb)
    # the rotated leading part of each head (partial rotary: < d_head); Gemma 3 has an inv_freq per layer type
    inv_freq = next((b for n, b in rotary.named_buffers() if n.endswith("inv_freq")), None)
    if inv_freq is None:
        raise ValueError("the packed model cannot run this bridge: its rotary embedding has no inv_freq")
    rotary_dim = 2 * inv_freq.numel()
    types = list(getattr(cfg, "layer_types", None) or []) or [None] * len(hf.model.layers)
    eps = float(cfg.rms_norm_eps)
    d_head = bridge.cfg.d_head
    dtype = bridge.cfg.dtype

    def tables_of(n: int, layer_type: str | None) -> tuple[Tensor, Tensor]:
        """cos and sin of positions 0..n-1, (n, rotary_dim), as the model's rotary embedding computes them
        (for ``layer_type``'s rotary base where the model has one per layer type); each frequency twice, side by
        side for adjacent pairs, else once per half."""
        prefix = f"{layer_type}_" if layer_type is not None and hasattr(rotary, f"{layer_type}_inv_freq") else ""
        scale = float(getattr(rotary, f"{prefix}attention_scaling", 1.0))
        with torch.inference_mode(False), torch.no_grad():  # tables enter autograd graphs later
            inv = getattr(rotary, f"{prefix}inv_freq").float().clone()
            freqs = torch.outer(torch.arange(n, device=inv.device, dtype=torch.float32), inv)
            emb = freqs.repeat_interleave(2, -1) if adjacent else torch.cat((freqs, freqs), -1)
            return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)

    size = [2048]  # the tables' length: doubled when a longer sequence needs more

    def tables(n: int) -> list[tuple[Tensor, Tensor]]:
        size[0] = max(n, 2 * size[0]) if n > size[0] else size[0]
        by_type = {t: tables_of(size[0], t) for t in set(types)}
        return [by_type[t] for t in types]

    def pack_layer(i: int, layer, cos: Tensor, sin: Tensor) -> PackedLayer:
        """Layer i's weights as a ``PackedLayer``, read by their transformers names."""
        pre = f"model.layers.{i}."
        a, mlp = _raw(layer.self_attn), _raw(layer.mlp)

        def w(name: str) -> Tensor:  # a Linear's weight, (out, in)
            return p[pre + name + ".weight"]

        def b(name: str) -> Tensor | None:
            return p.get(pre + name + ".bias")

        def gain(name: str) -> Tensor | None:  # what a norm multiplies by
            t = p.get(pre + name + ".weight")
            return None if t is None else t + offset

        def norm(name: str) -> Norm | None:
            g = gain(name)
            return None if g is None else (g, eps)

        ln2 = "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
        window = getattr(a, "sliding_window", None) if types[i] == "sliding_attention" else None
        if arch in WINDOWED:
            window = getattr(cfg, "sliding_window", None)
        # (out, in) matrices stacked as the model splits them: one fused Linear (Phi-3's Q/K/V, Phi-3's and GLM's
        # gate/up) or the parts' rows one after another
        qkv = [f"self_attn.{n}_proj" for n in "qkv"]
        qkv = ["self_attn.qkv_proj"] if pre + "self_attn.qkv_proj.weight" in p else qkv
        gate_up = ["mlp.gate_up_proj"] if pre + "mlp.gate_up_proj.weight" in p else ["mlp.gate_proj", "mlp.up_proj"]
        w_qkv, w_gate_up = (torch.cat([w(n) for n in names], 0) for names in (qkv, gate_up))
        qkv_bias = [b(n) for n in qkv]
        return PackedLayer(
            eps1=eps,
            # (d_model, (h + 2 kv) d_head), the pre-norm's gain folded in, as packed_layer.pack_block packs it
            w_qkv=gain("input_layernorm")[:, None] * w_qkv.T,
            b_qkv=None
            if all(x is None for x in qkv_bias)
            else bias_or_none(torch.cat([x for x in qkv_bias if x is not None])),
            w_o=w("self_attn.o_proj").T.contiguous(),  # (head d_head, d_model)
            b_o=bias_or_none(b("self_attn.o_proj")),
            scale=1.0 / float(a.scaling),
            cos=cos,
            sin=sin,
            eps2=eps,
            w_gate_in=gain(ln2)[:, None] * w_gate_up.T,
            b_in=None,
            w_out=w("mlp.down_proj").T.contiguous() if rows else w("mlp.down_proj").clone(),  # a snapshot
            b_out=None,
            act=getattr(mlp, "act_fn", None) or mlp.activation_fn,
            q_norm=norm("self_attn.q_norm"),
            k_norm=norm("self_attn.k_norm"),
            ln1_post=norm("post_attention_layernorm") if gemma else None,
            ln2_post=norm("post_feedforward_layernorm") if gemma else None,
            window=window,
        )

    first = tables(size[0])
    with torch.inference_mode(False), torch.no_grad():
        layers = [pack_layer(i, _raw(layer), *first[i]) for i, layer in enumerate(hf.model.layers)]
        head = _raw(hf.lm_head)
        unembed = head.weight.T.contiguous()  # (d_model, d_vocab)
        w_final = p["model.norm.weight"] + offset
    embed = p["model.embed_tokens.weight"]
    scale = getattr(_raw(hf.model.embed_tokens), "embed_scale", None)
    reference = BridgeBackend(bridge, cached=True)  # its cache was checked against its forward by bridge_unsupported

    def prefix(tokens: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        got = reference.prefix(tokens)
        return got.keys, got.values

    n_heads = bridge.cfg.n_heads
    return PackedWeights(
        layers=layers,
        embed=embed,
        embed_scale=None if scale is None else scale.to(embed.dtype).item(),
        unembed=unembed,
        b_U=bias_or_none(getattr(head, "bias", None)),
        w_final=w_final,
        eps_final=eps,
        n_heads=n_heads,
        n_kv=getattr(cfg, "num_key_value_heads", None) or n_heads,
        d_head=d_head,
        d_mlp=cfg.intermediate_size,
        rotary_dim=rotary_dim,
        adjacent=adjacent,
        n_ctx=cfg.max_position_embeddings,
        rows=rows,
        tables=tables,
        prefix=prefix,
        keys_rotated=True,
    )
