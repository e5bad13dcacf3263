"""Adapter save/load: a folder with cfg.json and adapter.safetensors (t and theta).

cfg.json records what the numbers depend on: the model's identity and shape,
its TransformerLens loading flags, the gate (how theta becomes alpha), M, N,
the seed and the training config.
Loading checks all of that against the model it is meant for; only JSON and
safetensors are read (no pickle).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from .files import plain_modes
from .gate import GateSpec, Hooks, Injection

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "adapter.safetensors"
FORMAT = "site-lens-adapter/2"  # /2: a gate other than SITE's sigmoid, a field of cfg.json
FORMAT_SIGMOID = "site-lens-adapter/1"  # SITE's sigmoid gate: readable by versions before the gate field
READS = (FORMAT, FORMAT_SIGMOID)
# identity keys an adapter must share with the model it is loaded onto; then its name, and the
# source digest (GGUF file) where both record one, else the weights digest (``identity.weights_digest``)
MATCH_KEYS = ("architecture", "n_layers", "n_heads", "d_head", "d_model", "d_vocab", "processing")


class AdapterError(ValueError):
    """An adapter folder is missing, corrupt, or made for another model."""


@dataclass
class Adapter:
    """A trained SITE adapter: task embedding t and gate logits theta.

    Example:
        >>> import torch
        >>> import site_lens as sl
        >>> model = sl.tiny_model()
        >>> t = sl.build_task_embedding(model, [[1, 5, 7, 2, 9, 4], [3, 5, 8, 2, 6]])
        >>> adapter = Adapter(t=t, theta=torch.zeros(2, 4), model=sl.model_identity(model))  # fit_site makes these
        >>> adapter.alpha.shape                          # sigmoid(theta): one gate per (layer, head)
        torch.Size([2, 4])
        >>> with model.hooks(fwd_hooks=adapter.hooks(model, pos=-1)):   # SITE injected at the last token
        ...     logits = model(torch.tensor([[1, 5, 7]]))
        >>> logits.shape
        torch.Size([1, 3, 50])
    """

    t: Float[Tensor, "layer head_index d_head"]
    theta: Float[Tensor, "layer head_index"]
    model: dict[str, Any]  # models.model_identity(...)
    meta: dict[str, Any] = field(default_factory=dict)  # task, seed, M, N, selection config, ...
    gate: GateSpec = field(default_factory=GateSpec)  # SITE's sigmoid; sparse SITE's hard-concrete gates and masks

    def __post_init__(self) -> None:
        if "gate" in self.meta:  # the gate is a field: one left in meta would be ignored
            raise AdapterError("Adapter.meta has a 'gate' entry; pass the gate as Adapter(gate=GateSpec(...))")

    @property
    def alpha(self) -> Float[Tensor, "layer head_index"]:
        """The gate's alpha for theta: sigmoid(theta) for SITE (``gate.GateSpec``)."""
        return self.gate.alpha(self.theta)

    def injection(self, device: Any = None, dtype: torch.dtype | None = None, at: Tensor | int = -1) -> Injection:
        """The adapter's ``gate.Injection`` (t and alpha on ``device`` in ``dtype``) at each row's last prompt token
        ``at``."""
        return Injection(self.t.to(device=device, dtype=dtype), self.alpha.to(device=device, dtype=dtype), at)

    def hooks(self, model, pos: Tensor | int = -1) -> Hooks:
        """Injection hooks for ``model`` (t and alpha on its device and in its dtype) at position ``pos`` of each row."""
        return self.injection(model.cfg.device, model.cfg.dtype, pos).hooks(model)

    def check_model(self, identity: dict[str, Any]) -> None:
        """Raise AdapterError unless ``identity`` (of a loaded model) matches this adapter's.

        Shape and processing must be equal; so must the name, and the digest: the GGUF source's
        where both record one, else the weights' (adapters saved before it existed skip it).
        """
        mine_name, their_name = self.model.get("name"), identity.get("name")

        def refuse(what: str, mine: Any, theirs: Any) -> AdapterError:
            return AdapterError(
                f"adapter was made for model '{mine_name}' with {what}={mine}, "
                f"but this model '{their_name}' has {what}={theirs}"
            )

        for k in MATCH_KEYS:
            if self.model.get(k) != identity.get(k):
                raise refuse(k, self.model.get(k), identity.get(k))
        if mine_name != their_name:
            raise AdapterError(f"adapter was made for model '{mine_name}', not '{their_name}'")
        for k in ("source_sha256", "weights_sha256"):
            mine, theirs = self.model.get(k), identity.get(k)
            if mine is not None and theirs is not None:
                if mine != theirs:
                    raise refuse(k, mine[:16], theirs[:16])
                return


def save_adapter(adapter: Adapter, path: str | Path) -> Path:
    """Write the folder atomically (a temp folder renamed into place).

    Example:
        >>> import tempfile
        >>> import torch
        >>> import site_lens as sl
        >>> model = sl.tiny_model()
        >>> t = sl.build_task_embedding(model, [[1, 5, 7, 2, 9, 4]])
        >>> adapter = sl.Adapter(t=t, theta=torch.zeros(2, 4), model=sl.model_identity(model))
        >>> folder = save_adapter(adapter, f"{tempfile.mkdtemp()}/uppercase-adapter")
        >>> folder.name, folder.is_dir()
        ('uppercase-adapter', True)
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp"))
    try:
        save_file(
            {
                "t": adapter.t.detach().float().cpu().contiguous(),
                "theta": adapter.theta.detach().float().cpu().contiguous(),
            },
            str(tmp / WEIGHTS_FILE),
        )
        digest = hashlib.sha256((tmp / WEIGHTS_FILE).read_bytes()).hexdigest()  # a few kB: free
        fmt = FORMAT_SIGMOID if adapter.gate == GateSpec() else FORMAT
        cfg = {"format": fmt, "model": adapter.model, "gate": adapter.gate.to_dict(), "meta": adapter.meta}
        cfg["weights_sha256"] = digest
        (tmp / CFG_FILE).write_text(json.dumps(cfg, indent=1, sort_keys=True))
        replace_folder(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def replace_folder(tmp: Path, path: Path) -> None:
    """Put the finished folder ``tmp`` at ``path``, replacing an old one (moved aside, then removed).

    The folder and its files get the modes ``mkdir()`` and ``open()`` give (``files.plain_modes``):
    ``mkdtemp``'s folder is 0700 and safetensors' files 0600.
    """
    plain_modes(tmp)
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def load_adapter(path: str | Path, model_identity: dict[str, Any] | None = None) -> Adapter:
    """Read an adapter folder; if ``model_identity`` is given, refuse a mismatched model.

    Example:
        >>> import tempfile
        >>> import torch
        >>> import site_lens as sl
        >>> model = sl.tiny_model()
        >>> t = sl.build_task_embedding(model, [[1, 5, 7, 2, 9, 4]])
        >>> folder = sl.save_adapter(sl.Adapter(t=t, theta=torch.zeros(2, 4), model=sl.model_identity(model)),
        ...                          f"{tempfile.mkdtemp()}/adapter")
        >>> adapter = load_adapter(folder, sl.model_identity(model))   # refuses an adapter of another model
        >>> torch.equal(adapter.t, t)
        True
        >>> load_adapter(folder, sl.model_identity(sl.tiny_model(n_heads=8, n_key_value_heads=4)))
        Traceback (most recent call last):
            ...
        site_lens.adapter.AdapterError: ...
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg_path, w_path = path / CFG_FILE, path / WEIGHTS_FILE
    if not path.is_dir():
        raise AdapterError(f"{path}: adapter folder not found")
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise AdapterError(f"{p}: missing from the adapter folder")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (ValueError, RecursionError, OSError) as e:  # JSONDecodeError, UnicodeDecodeError, > 4300-digit ints
        raise AdapterError(f"{cfg_path}: not valid JSON ({e.__class__.__name__}: {str(e)[:200]})") from None
    if not isinstance(cfg, dict) or cfg.get("format") not in READS or not isinstance(cfg.get("model"), dict):
        raise AdapterError(f"{cfg_path}: not a {FORMAT} config (needs keys 'format', 'model', 'meta')")
    if not isinstance(cfg.get("meta", {}), dict):
        raise AdapterError(f"{cfg_path}: 'meta' must be an object, got {type(cfg['meta']).__name__}")
    try:
        tensors = load_file(str(w_path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise AdapterError(f"{w_path}: unreadable safetensors ({e})") from None
    want = cfg.get("weights_sha256")  # absent in adapters written before it was recorded
    if want is not None and hashlib.sha256(w_path.read_bytes()).hexdigest() != want:
        raise AdapterError(f"{w_path}: contents do not match the SHA-256 in cfg.json (corrupted or replaced)")
    if set(tensors) != {"t", "theta"}:
        raise AdapterError(f"{w_path}: expected tensors 't' and 'theta', found {sorted(tensors)}")
    t, theta = tensors["t"], tensors["theta"]
    m = cfg["model"]
    want_t = (m.get("n_layers"), m.get("n_heads"), m.get("d_head"))
    if tuple(t.shape) != want_t or tuple(theta.shape) != want_t[:2]:
        raise AdapterError(
            f"{w_path}: t has shape {tuple(t.shape)} and theta {tuple(theta.shape)}, but cfg.json says "
            f"(layer, head, d_head) = {want_t}"
        )
    if t.dtype != torch.float32 or theta.dtype != torch.float32:
        raise AdapterError(f"{w_path}: expected float32 tensors, got t {t.dtype} and theta {theta.dtype}")
    if not (torch.isfinite(t).all() and torch.isfinite(theta).all()):
        raise AdapterError(f"{w_path}: t or theta holds non-finite values")
    meta = dict(cfg.get("meta", {}))
    recorded = cfg.get("gate", meta.pop("gate", None))  # folders written before the gate field keep it in meta
    try:
        adapter = Adapter(t=t, theta=theta, model=m, meta=meta, gate=GateSpec.from_dict(recorded))
        _ = adapter.alpha  # the gate's numbers are numbers
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise AdapterError(f"{cfg_path}: gate is not a gate this version reads ({e})") from None
    if model_identity is not None:
        adapter.check_model(model_identity)
    return adapter
