"""Files and folders site-lens writes end with the modes a plain open() / mkdir() gives under the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

MASKS = (0o022, 0o077)


@pytest.fixture(params=MASKS, ids=lambda m: f"umask{m:03o}")
def mask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (and ``root``) with its permission bits."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def expect(root: Path, mask: int) -> dict[str, int]:
    """What open() gives each file and mkdir() each folder under ``mask``."""
    return {k: (0o777 if (root / k).is_dir() else 0o666) & ~mask for k in modes(root)}


def check(root: Path, mask: int) -> None:
    got = modes(root)
    assert len(got) > 1 or root.is_file()
    assert {k: oct(v) for k, v in got.items()} == {k: oct(v) for k, v in expect(root, mask).items()}


def test_umask_is_read_without_changing_it(mask):
    from site_lens.files import umask

    assert umask() == mask
    assert os.umask(mask) == mask


def test_adapter_folder(mask, tmp_path):
    from site_lens.adapter import Adapter, save_adapter

    a = Adapter(t=torch.randn(2, 3, 4), theta=torch.randn(2, 3), model={"name": "tiny"})
    save_adapter(a, tmp_path / "ad")
    check(tmp_path / "ad", mask)
    save_adapter(a, tmp_path / "ad")  # replacing an existing folder
    check(tmp_path / "ad", mask)


def test_atlas_folder(mask, tmp_path):
    from site_lens.atlas import Atlas, load_atlas

    model = {"name": "tiny", "architecture": "LlamaForCausalLM", "n_layers": 1, "n_heads": 2, "d_head": 4}
    heads = pd.DataFrame(
        {"task": "upper", "seed": 0, "layer": 0, "head": [0, 1], "theta": [0.5, -0.5], "alpha": [0.6, 0.4],
         "alpha_rank": [1, 2]}
    )  # fmt: skip
    scores = pd.DataFrame(
        {"task": ["upper"], "seed": [0], "method": ["site"], "first_token_acc": [1.0], "exact_match": [1.0],
         "strict_match": [1.0], "n_test": [3]}
    )  # fmt: skip
    manifest = {"schema_version": 1, "model": model, "tasks": {"upper": {"category": "x"}}, "seeds": [0]}
    Atlas(manifest, heads, scores, {"upper/seed0": torch.randn(1, 2, 4)}).save(tmp_path / "atlas")
    check(tmp_path / "atlas", mask)
    assert load_atlas(tmp_path / "atlas").tasks == ["upper"]


def test_cie_and_other_tensor_files(mask, tmp_path):
    from site_lens.experiments.sweep import _save_tensors

    run = tmp_path / "run"
    run.mkdir()
    _save_tensors(run, "cie.safetensors", {"cie": torch.randn(2, 3)})
    check(run, mask)


@pytest.fixture(scope="module")
def small_model():
    from helpers import char_tokenizer

    from site_lens.models.engines import HOOKED

    if HOOKED is None:  # TransformerLens 4: the bridge engine
        from site_lens.models.tiny import tiny_bridge

        return tiny_bridge("llama", char_tokenizer(), name="tiny", max_position_embeddings=256)
    from helpers import tiny

    return tiny(n_ctx=256)


def test_cie_file_of_the_report(mask, tmp_path, small_model):
    from site_lens.adapter import Adapter
    from site_lens.experiments.report import CIE_FILE, Run, analyse_runs
    from site_lens.models import model_identity

    c = small_model.cfg
    adapter = Adapter(t=torch.randn(c.n_layers, c.n_heads, c.d_head), theta=torch.randn(c.n_layers, c.n_heads),
                      model=model_identity(small_model))  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    analyse_runs(small_model, [Run(run, "opposites", {"task_source": "builtin:opposites"}, adapter)],
                 max_items=2, cie_prompts=2, draws=1, n_shots=2)  # fmt: skip
    assert (run / CIE_FILE).is_file()
    check(run, mask)


def test_weight_cache_entry(mask, tmp_path):
    from helpers import char_tokenizer

    from site_lens.models import weight_cache

    model = torch.nn.Linear(3, 2)
    model.tokenizer = char_tokenizer()
    model.cfg = SimpleNamespace(to_dict=lambda: {"d_model": 3})
    entry = tmp_path / "cache" / "tiny-entry"
    weight_cache.save(entry, model, "0" * 64)
    assert (entry / weight_cache.WEIGHTS_FILE).is_file()
    check(tmp_path / "cache", mask)


def test_hf_cache_entry(mask, tmp_path):
    from helpers import char_tokenizer

    from site_lens.models.hf import _save_hf

    model = torch.nn.Linear(3, 2)
    model.config = SimpleNamespace(to_dict=lambda: {"hidden_size": 3})
    entry = tmp_path / "hf" / "tiny-entry"
    assert _save_hf(entry, model, char_tokenizer(), "0" * 64)
    assert (entry / "model.safetensors").is_file()
    check(tmp_path / "hf", mask)


def test_plain_modes_keeps_the_owners_execute_bit_and_skips_links(mask, tmp_path):
    from site_lens.files import plain_modes

    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "run.sh").touch(mode=0o700)
    (tmp_path / "d" / "data").touch(mode=0o600)
    (tmp_path / "d" / "link").symlink_to("data")
    plain_modes(tmp_path / "d")
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((tmp_path / "d" / "run.sh").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((tmp_path / "d" / "data").stat().st_mode) == 0o666 & ~mask
