# iris-rag: the MCP server (Node front end + Python worker) with CPU-only PyTorch and the offline model.
# Build: docker build -t iris-rag .
# Run under an MCP client: docker run -i --rm -v iris-rag-data:/data iris-rag
FROM node:20-bookworm-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . .

# Install exactly as the README does (scripts/setup.sh), with torch from the CPU-only index and no dev extras.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV TORCH_INDEX_URL=${TORCH_INDEX_URL} \
    IRIS_RAG_EXTRAS="" \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    RAG_DATA_DIR=/data
RUN bash scripts/setup.sh

# The bundled sample corpus, so a fresh container answers at once.
RUN .venv/bin/iris-rag ingest samples/scifact/corpus.jsonl --collection scifact-sample

VOLUME ["/data"]
# stdio carries MCP, so the health check opens the store and checks the model files itself.
HEALTHCHECK --interval=60s --timeout=20s --start-period=30s --retries=3 \
  CMD [".venv/bin/iris-rag", "health", "--quick"]

CMD ["node", "mcp-server/dist/index.js"]
