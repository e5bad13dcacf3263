"""The packed last-token engine for a TransformerBridge: ``LastToken`` built from the Hugging Face-layout weights.

``LastToken``'s forward reads one ``packed_layer.PackedLayer`` per layer (Q/K/V
concatenated with the pre-norm's gain folded in, the output and MLP matrices
input-major, rotary tables, norms); ``BridgePack`` builds the same records from
the native transformers modules a bridge wraps, and takes its prefixes from the
bridge's KV cache (keys already rotated, as ``LastToken`` keeps them). The
forward is ``LastToken``'s own, so one packed engine serves both model engines.

It covers Llama-style blocks (Llama, Mistral, Qwen2; Qwen3's per-head Q/K
norms) and Gemma 3 ((1 + w) norms, a norm after each sublayer, a scaled
embedding, sliding-window layers with their own rotary base) in float32 or
float64 on one device; ``backend.backend_for`` holds it to the bridge's own
forward on a probe prompt before using it.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from ..models.engines import architecture
from .bridge_backend import BridgeBackend, cache_agrees
from .kernels import available as kernels_available
from .packed import LastToken
from .packed_layer import Norm, PackedLayer, bias_or_none
from .prefix import Prefix

# transformers architectures whose blocks BridgePack packs (each held to the bridge by the probe as well)
PACKED_BRIDGE_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"}
)
GEMMA = "Gemma3ForCausalLM"  # (1 + w) norms, a norm after each sublayer, a scaled embedding, sliding layers


def _raw(module):
    """The transformers module a bridge component wraps (the module itself where it wraps none)."""
    return getattr(module, "_original_component", module)


def _params(hf_model) -> dict[str, Tensor]:
    """The model's parameters by their transformers names (the bridge's wrapper levels left out)."""
    out: dict[str, Tensor] = {}
    for name, p in hf_model.named_parameters():
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
    """Why ``BridgePack`` cannot run this bridge (None when it can, before the probe check)."""
    hf = bridge.original_model
    arch = architecture(bridge)
    cfg = hf.config
    devices = {str(d) for d in (getattr(hf, "hf_device_map", None) or {}).values()}
    checks = [
        (arch not in PACKED_BRIDGE_ARCHITECTURES, f"architecture {arch} is not one the packed path covers"),
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
            isinstance(getattr(cfg, "sliding_window", None), int)
            and getattr(cfg, "use_sliding_window", True)
            and arch == "MistralForCausalLM",
            "sliding-window attention",
        ),
        (
            arch != GEMMA and any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])),
            "sliding-window layers",
        ),
        (getattr(cfg, "attn_logit_softcapping", None) is not None, "attention soft cap"),
        (getattr(cfg, "final_logit_softcapping", None) is not None, "logit soft cap"),
        (not cache_agrees(bridge), "the bridge's KV cache (which gives the prefixes) disagrees with its forward"),
    ]
    return next((why for bad, why in checks if bad), None)


class BridgePack(LastToken):
    """``LastToken`` from a bridge's transformers weights; prefixes from the bridge's KV cache."""

    def __init__(self, bridge):
        why = bridge_unsupported(bridge)
        if why is not None:
            raise ValueError(f"BridgePack cannot run this model: {why}")
        self.model = bridge
        hf = bridge.original_model
        cfg = hf.config
        self.n_heads, self.d_head = bridge.cfg.n_heads, bridge.cfg.d_head
        self.d_mlp = cfg.intermediate_size
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.rotary_dim = self.d_head
        self.adjacent = False  # transformers rotates halves
        self.n_ctx = cfg.max_position_embeddings
        self.rows = kernels_available()
        self._reference = BridgeBackend(bridge, cached=True)
        self.gemma = architecture(bridge) == GEMMA
        self.offset = 1.0 if self.gemma else 0.0  # Gemma's RMSNorm multiplies by (1 + w)
        p = _params(hf)
        self._rotary = _raw(hf.model.rotary_emb)
        types = list(getattr(cfg, "layer_types", None) or [])
        self.layer_types = types if types else [None] * len(hf.model.layers)
        tables = {t: self._tables(2048, t) for t in set(self.layer_types)}
        with torch.inference_mode(False), torch.no_grad():
            self.layers = [
                self._pack_hf(p, i, _raw(layer), *tables[self.layer_types[i]])
                for i, layer in enumerate(hf.model.layers)
            ]
            head = _raw(hf.lm_head)
            self.unembed = head.weight.T.contiguous()  # (d_model, d_vocab)
            self.w_final = p["model.norm.weight"] + self.offset
        self.embed = p["model.embed_tokens.weight"]
        scale = getattr(_raw(hf.model.embed_tokens), "embed_scale", None)
        self.embed_scale = None if scale is None else scale.to(self.embed.dtype).item()
        self.eps_final = float(cfg.rms_norm_eps)
        self.b_U = bias_or_none(getattr(head, "bias", None))
        self._share_tables()

    def _tables(self, n: int, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        """cos and sin of positions 0..n-1, (n, d_head), as the model's rotary embedding computes them
        (for ``layer_type``'s rotary base where the model has one per layer type)."""
        rot = self._rotary
        prefix = f"{layer_type}_" if layer_type is not None and hasattr(rot, f"{layer_type}_inv_freq") else ""
        scale = float(getattr(rot, f"{prefix}attention_scaling", 1.0))
        dtype = self.model.cfg.dtype
        with torch.inference_mode(False), torch.no_grad():  # tables enter autograd graphs later
            inv = getattr(rot, f"{prefix}inv_freq").float().clone()
            freqs = torch.outer(torch.arange(n, device=inv.device, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), -1)
            return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)

    def _cover(self, n: int) -> None:
        """Grow every layer's rotary table to ``n`` positions."""
        if n <= self.layers[0].cos.shape[0]:
            return
        size = max(n, 2 * self.layers[0].cos.shape[0])
        tables = {t: self._tables(size, t) for t in set(self.layer_types)}
        for w, t in zip(self.layers, self.layer_types):
            w.cos, w.sin = tables[t]

    def _pack_hf(self, p: dict[str, Tensor], i: int, layer, cos: Tensor, sin: Tensor) -> PackedLayer:
        """Layer i's weights as a ``PackedLayer``, read by their transformers names."""
        pre = f"model.layers.{i}."
        a, mlp = _raw(layer.self_attn), _raw(layer.mlp)
        eps = float(self.model.original_model.config.rms_norm_eps)

        def w(name: str) -> Tensor:  # a Linear's weight, (out, in)
            return p[pre + name + ".weight"]

        def b(name: str) -> Tensor | None:
            return p.get(pre + name + ".bias")

        def gain(name: str) -> Tensor | None:  # what a norm multiplies by
            t = p.get(pre + name + ".weight")
            return None if t is None else t + self.offset

        def norm(name: str) -> Norm | None:
            g = gain(name)
            return None if g is None else (g, eps)

        qkv_bias = [b(f"self_attn.{n}_proj") for n in "qkv"]
        ln2 = "pre_feedforward_layernorm" if self.gemma else "post_attention_layernorm"
        window = getattr(a, "sliding_window", None) if self.layer_types[i] == "sliding_attention" else None
        return PackedLayer(
            eps1=eps,
            # (d_model, (h + 2 kv) d_head), the pre-norm's gain folded in, as packed_layer.pack_block packs it
            w_qkv=gain("input_layernorm")[:, None] * torch.cat([w(f"self_attn.{n}_proj").T for n in "qkv"], 1),
            b_qkv=None
            if all(x is None for x in qkv_bias)
            else bias_or_none(torch.cat([x for x in qkv_bias if x is not None])),
            w_o=w("self_attn.o_proj").T.contiguous(),  # (head d_head, d_model)
            b_o=bias_or_none(b("self_attn.o_proj")),
            scale=1.0 / float(a.scaling),
            cos=cos,
            sin=sin,
            eps2=eps,
            w_gate_in=gain(ln2)[:, None] * torch.cat([w("mlp.gate_proj").T, w("mlp.up_proj").T], 1),
            b_in=None,
            w_out=w("mlp.down_proj").T.contiguous() if self.rows else w("mlp.down_proj").clone(),  # a snapshot
            b_out=None,
            act=mlp.act_fn,
            q_norm=norm("self_attn.q_norm"),
            k_norm=norm("self_attn.k_norm"),
            ln1_post=norm("post_attention_layernorm") if self.gemma else None,
            ln2_post=norm("post_feedforward_layernorm") if self.gemma else None,
            window=window,
        )

    @torch.no_grad()
    def prefix(self, tokens: Int[Tensor, "batch pos"]) -> Prefix:
        """Prompt prefixes through the bridge once, into its KV cache (keys rotated, as LastToken keeps them)."""
        self._cover(tokens.shape[1] + 1)
        return self._reference.prefix(tokens)

    def decode_cache(self, cache, attention_mask, extra):
        raise NotImplementedError("a bridge's packed engine decodes from start_decode; prefill with BridgeBackend")
