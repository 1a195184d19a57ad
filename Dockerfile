# iris-rag as a shared HTTP service: MCP over Streamable HTTP at :3000/mcp, GET /health, API keys required.
# Build: docker build -t iris-rag .
# Run:   docker run --rm -p 127.0.0.1:3000:3000 -v iris-rag-data:/data \
#          -v "$PWD/principals.json:/config/principals.json:ro" iris-rag
# Under an MCP client on stdio instead: docker run -i --rm -e MCP_TRANSPORT=stdio -v iris-rag-data:/data iris-rag
# (README, "HTTP service" and "Container").
FROM node:20-bookworm-slim

# espeak-ng: rag_generate_podcast's speech engine (the espeakng-loader wheel also ships it; either serves).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv curl espeak-ng \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 iris

WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    RAG_DATA_DIR=/data

# Dependencies first, from the manifests alone: a source edit does not reinstall torch or node_modules.
# Both store drivers (postgres, iris) are installed: RAG_STORE picks the store at run time.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY pyproject.toml constraints.txt ./
RUN python3 -m venv .venv \
 && .venv/bin/pip install torch==2.13.0 --index-url "$TORCH_INDEX_URL" \
 && .venv/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['postgres'] + p['optional-dependencies']['iris']))" \
    > /tmp/requirements.txt \
 && .venv/bin/pip install -c constraints.txt -r /tmp/requirements.txt
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error

# The source, the package itself (no dependencies left to fetch), the front end built, dev packages gone.
COPY . .
RUN .venv/bin/pip install --no-deps -e ".[postgres,iris]" \
 && .venv/bin/python -m iris_rag.embedder export-onnx \
 && npm run --silent build \
 && npm prune --omit=dev --no-audit --no-fund --loglevel=error

# The bundled sample, so a fresh container answers at once. A named volume at /data starts with it; a bind
# mount over /data hides it (ingest it there with `iris-rag ingest samples/scifact/corpus.jsonl`).
RUN .venv/bin/iris-rag ingest samples/scifact/corpus.jsonl --collection scifact-sample \
 && mkdir -p /config && chown -R iris:iris /data /config
VOLUME ["/data"]

USER iris
ENV MCP_TRANSPORT=http \
    MCP_SERVER_HOST=0.0.0.0 \
    MCP_SERVER_PORT=3000 \
    RAG_AUTH_FILE=/config/principals.json \
    RAG_DEFAULT_COLLECTION=scifact-sample
EXPOSE 3000
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
  CMD curl -fsS http://localhost:3000/health || exit 1

CMD ["node", "mcp-server/dist/index.js"]
