#!/usr/bin/env bash
# Install everything: the Python worker in .venv (CPU-only PyTorch, the offline embedding model) and the
# Node front end, built. Safe to re-run; it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PYTHON" --version)" >&2
  "$PYTHON" -m venv .venv
fi
echo "setup: installing the Python worker (pinned CPU torch, see constraints.txt)" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  # Containers and machines without a local torch wheel take the CPU build from a CPU-only index.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0 --index-url "$TORCH_INDEX_URL"
fi
EXTRAS="${IRIS_RAG_EXTRAS-dev}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"
echo "setup: exporting the embedding model to ONNX (EMBEDDING_BACKEND=auto uses it; torch otherwise)" >&2
.venv/bin/python -m iris_rag.embedder export-onnx \
  || echo "setup: the ONNX export failed (see above); EMBEDDING_BACKEND=auto will use torch" >&2

echo "setup: installing and building the MCP front end" >&2
npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
echo "setup: done" >&2
