"""The model caches: the weight cache of HookedTransformer models and the transformers checkpoints the bridge
and ``load_hf_model`` read. An entry that does not match its source, or whose files are missing, truncated,
replaced or unreadable, is rebuilt with a warning, never used; entries are written whole, and one another
process finished meanwhile is kept.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from site_lens.models import hf, weight_cache
from site_lens.models.engines import HOOKED


@dataclass(frozen=True)
class Cache:
    """A model cache as these tests see it."""

    meta: str
    weights: str
    version_key: str
    tokenizer: tuple[str, ...]  # what a lost tokenizer takes with it
    config: str  # a config file read at load time
    logger: str
    unwritable: str  # what its warning says

    def model(self) -> Any:
        """A tiny model of the kind the cache holds."""
        from helpers import char_tokenizer, tiny

        from site_lens.models.tiny import tiny_hf

        torch.manual_seed(0)
        return tiny() if self is WEIGHT_CACHE else tiny_hf("llama", char_tokenizer())

    def save(self, entry: Path, model: Any, digest: str = "f" * 64, since: float | None = None) -> None:
        from helpers import char_tokenizer

        if self is WEIGHT_CACHE:
            weight_cache.save(entry, model, digest, since=since)
        else:
            hf._save_hf(entry, model, char_tokenizer(), digest, since=since)

    def load(self, entry: Path, digest: str = "f" * 64) -> Any:
        """The entry's model as a function of tokens giving logits, or None where the cache refuses it."""
        if self is WEIGHT_CACHE:
            return weight_cache.load(entry, digest, "cpu", torch.float32)
        loaded = hf._load_cached(entry, digest, torch.float32, None)
        return None if loaded is None else (lambda tokens: loaded[0](tokens).logits)

    @staticmethod
    def logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
        out = model(tokens)
        return out if torch.is_tensor(out) else out.logits


WEIGHT_CACHE = Cache(
    weight_cache.META_FILE,
    weight_cache.WEIGHTS_FILE,
    "cache_version",
    ("tokenizer",),
    "tokenizer/tokenizer_config.json",
    "site_lens.models.weight_cache",
    "could not write the weight cache",
)
HF_CACHE = Cache(
    hf.HF_META,
    hf.HF_WEIGHTS,
    "version",
    ("tokenizer.json", "tokenizer_config.json"),
    "config.json",
    "site_lens.models.hf",
    "could not write the HF model cache",
)
# the weight cache holds HookedTransformer models, which TransformerLens 4 removed
CACHES = {"weights": WEIGHT_CACHE, "transformers": HF_CACHE} if HOOKED is not None else {"transformers": HF_CACHE}


@pytest.fixture(params=sorted(CACHES))
def cache(request):
    return CACHES[request.param]


@pytest.fixture
def written(cache, tmp_path) -> tuple[Path, Any]:
    """(entry, model): a tiny model written as an entry under a fake source digest."""
    model = cache.model()
    entry = tmp_path / "tiny-0123456789abcdef-v1"
    cache.save(entry, model)
    assert (entry / cache.meta).is_file() and (entry / cache.weights).is_file()
    return entry, model


def test_a_cache_entry_loads_back_exactly(cache, written):
    entry, model = written
    loaded = cache.load(entry)
    assert loaded is not None
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.equal(loaded(tokens), cache.logits(model, tokens))


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
def test_damaged_or_stale_cache_is_rebuilt_not_used(cache, written, damage, digest, caplog):
    entry, _ = written
    assert cache.load(entry) is not None  # whole, it is used: the damage is what refuses it
    damage(entry, cache)
    with caplog.at_level("WARNING", logger=cache.logger):
        assert cache.load(entry, digest or "f" * 64) is None
    if cache is HF_CACHE or (entry / cache.meta).exists():  # (the weight cache is silent without its metadata)
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


def test_cache_fingerprint_records_size_and_header(cache, written):
    entry, _ = written
    meta = json.loads((entry / cache.meta).read_text())
    data = (entry / cache.weights).read_bytes()
    n = int.from_bytes(data[:8], "little")
    assert meta["source_sha256"] == "f" * 64
    assert meta["weights"] == {"bytes": len(data), "header_sha256": hashlib.sha256(data[8 : 8 + n]).hexdigest()}


def test_an_entry_written_meanwhile_is_kept_an_older_one_replaced(cache, written):
    """Two processes building one model: the second keeps the first's entry; one from before its own look is stale."""
    entry, model = written
    meta = entry / cache.meta
    written_at = meta.stat().st_mtime
    inode = meta.stat().st_ino
    cache.save(entry, model, "f" * 64, since=written_at - 60)  # the entry appeared after this one looked
    assert meta.stat().st_ino == inode  # theirs, untouched
    cache.save(entry, model, "e" * 64, since=written_at - 60)  # another source's entry: replaced
    assert json.loads(meta.read_text())["source_sha256"] == "e" * 64
    inode = meta.stat().st_ino
    cache.save(entry, model, "e" * 64, since=time.time() + 60)  # older than the look: replaced
    assert meta.stat().st_ino != inode
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]  # no temp or aside left


def test_unwritable_cache_does_not_stop_loading(cache, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level("WARNING", logger=cache.logger):
        cache.save(blocker / "entry", cache.model())
    assert cache.unwritable in caplog.text


def test_a_failed_write_leaves_nothing_behind(cache, tmp_path, monkeypatch):
    """An error other than the disk's (here from the tokenizer) is raised, and no temporary folder stays."""
    model = cache.model()
    tok = model.tokenizer if cache is WEIGHT_CACHE else None

    def boom(*a, **k):
        raise RuntimeError("tokenizer exploded")

    if tok is not None:
        monkeypatch.setattr(tok, "save_pretrained", boom)
    else:
        from transformers import PreTrainedTokenizerFast

        monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", boom)
    with pytest.raises(RuntimeError, match="tokenizer exploded"):
        cache.save(tmp_path / "entry", model)
    assert list(tmp_path.iterdir()) == []


def test_a_bad_argument_is_the_callers_error_and_the_entry_stays(tmp_path):
    """A keyword from_pretrained refuses is raised as it is, not taken for damage: the entry is neither rebuilt
    nor replaced."""
    entry = tmp_path / "tiny-0123456789abcdef-v1"
    HF_CACHE.save(entry, HF_CACHE.model())
    inode = (entry / HF_CACHE.meta).stat().st_ino
    with pytest.raises(Exception, match="device_map"):
        hf._load_cached(entry, "f" * 64, torch.float32, "not-a-device-map")
    assert (entry / HF_CACHE.meta).stat().st_ino == inode and HF_CACHE.load(entry) is not None
