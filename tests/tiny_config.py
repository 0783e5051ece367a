"""The smallest config the CLI tests run: two pairs of the example prompts, tiny GPT-2,
vanilla, 3 new tokens, the gender scorer; a test changes top-level keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PAIRS = Path(__file__).resolve().parents[1] / "examples" / "data"


def tiny_config(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "name": "t",
        "dataset": {
            "kind": "paired-jsonl",
            "files": {
                "female": str(PAIRS / "pairs-female.jsonl"),
                "male": str(PAIRS / "pairs-male.jsonl"),
            },
            "limit": 2,
        },
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 3},
        "scorers": ["gender"],
        **changes,
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path
