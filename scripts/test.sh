#!/usr/bin/env bash
# Run every check: install, format and lint, types (mypy strict, tsc strict), the Node tests and pytest
# (unit, worker-over-JSON-lines, and end to end through the real MCP server with real MCP clients).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

echo "== ruff format --check, ruff check, mypy" >&2
.venv/bin/ruff format --check iris_rag tests bench scripts
.venv/bin/ruff check iris_rag tests bench scripts
.venv/bin/mypy

echo "== TypeScript: tsc --noEmit and node --test" >&2
npm run --silent typecheck
npm run --silent test:node

echo "== pytest" >&2
.venv/bin/python -m pytest -p no:cacheprovider "$@"

echo "== the MCP end-to-end suites again, on PostgreSQL (RAG_STORE=postgres)" >&2
E2E_RAG_STORE=postgres .venv/bin/python -m pytest -p no:cacheprovider "$@" \
  tests/e2e/test_mcp_server.py tests/e2e/test_http_server.py
