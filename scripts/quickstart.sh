#!/usr/bin/env bash
# Install everything, ingest the bundled SciFact sample and ask it questions through the real MCP server.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/iris-rag ingest samples/scifact/corpus.jsonl --collection scifact-sample
.venv/bin/python scripts/demo_client.py "$@"
