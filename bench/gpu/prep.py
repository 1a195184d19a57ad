"""On the GPU machine: the float32 model from the carried float16 copy, and the BEIR folder (see pack.sh).

The model travels in float16 (the device tool takes 64 MiB of files); both devices then run the same
float32 weights, so their rankings can be compared. Argument: keep the documents judged for test queries
and the first N others (0: all), so the CPU run stays short.
"""

from __future__ import annotations

import gzip
import pathlib
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

PACKED = pathlib.Path(".gpucheck")


def main() -> None:
    source = PACKED / "model16"
    model = pathlib.Path("/tmp/model")
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(source, model, ignore=shutil.ignore_patterns("model16.safetensors"))
    weights = load_file(source / "model16.safetensors")
    save_file({k: v.to(torch.float32).contiguous() for k, v in weights.items()}, model / "model.safetensors")

    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    qrels = (PACKED / "scifact/qrels/test.tsv").read_text().splitlines()[1:]
    judged = {row.split("\t")[1] for row in qrels}
    with gzip.open(PACKED / "scifact/corpus.jsonl.gz", "rt") as f:
        lines = f.readlines()
    kept = [line for i, line in enumerate(lines) if not limit or i < limit or line.split('"')[3] in judged]
    out = pathlib.Path("/tmp/scifact")
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("".join(kept))
    with gzip.open(PACKED / "scifact/queries.jsonl.gz", "rt") as f:
        (out / "queries.jsonl").write_text(f.read())
    shutil.copy(PACKED / "scifact/qrels/test.tsv", out / "qrels/test.tsv")
    print("model and data ready:", len(kept), "documents")


if __name__ == "__main__":
    main()
