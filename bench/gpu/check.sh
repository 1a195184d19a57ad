#!/bin/bash
# EMBEDDING_DEVICE=cuda against cpu on one machine: iris-rag eval on SciFact test, the same fp32 weights.
# usage (on the GPU machine, in the checkout, .gpucheck/ carried; see pack.sh):
#   INSTALL=1 bash .gpucheck/check.sh [corpus-limit] [techniques]
set -u
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
if [ -n "${INSTALL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/deps .gpucheck/wheels/*.whl 2>&1 | tail -3
  export PYTHONPATH=/tmp/deps:$PWD
fi
$PY .gpucheck/prep.py "${1:-0}" || exit 1
TECH=${2:-basic,hybrid_ifind,colbert,crag,hyde}
nvidia-smi --query-gpu=name,memory.used --format=csv 2>/dev/null
for dev in ${DEVICES:-cuda cpu}; do
  rm -rf /tmp/d_$dev
  start=$(date +%s%N)
  RAG_DATA_DIR=/tmp/d_$dev EMBEDDING_DEVICE=$dev EMBEDDING_BACKEND=torch EMBEDDING_MODEL=/tmp/model \
    timeout ${EVAL_TIMEOUT:-250} $PY -m iris_rag.cli eval --dataset /tmp/scifact --split test \
    --techniques "$TECH" --out "$OUT/eval_$dev.json" > "$OUT/eval_$dev.log" 2>&1
  rc=$?
  echo "$dev: rc=$rc wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))"
  tr '\r' '\n' < "$OUT/eval_$dev.log" | grep -E 'ingest eval' | tail -1
  grep -v -E 'query/s|ingest eval|Loading weights' "$OUT/eval_$dev.log" | tail -12
done
