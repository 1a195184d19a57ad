"""The embedding model on ONNX Runtime: exported once at install time from the local weights, loaded fast.

`python -m iris_rag.embedder export-onnx` (run by scripts/setup.sh) writes the transformer of the configured
sentence-transformers model as ONNX into a folder keyed by a fingerprint of the model's files; nothing is
ever downloaded. At run time OnnxModel loads that file with onnxruntime and the tokenizer with the
`tokenizers` library, neither of which imports torch: the worker's first answer no longer waits for torch
and sentence-transformers to import (most of the model's load time, docs/benchmarks.md). Mean pooling and
normalization are the packaged model's own last two modules, done here in NumPy.

Only models that are transformer -> mean pooling -> normalize (the packaged all-MiniLM-L6-v2) export;
any other model keeps the torch backend.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
MANIFEST_FILE = "export.json"
OPSET = 17
EXPORT_FORMAT = 1  # bumped when the exported graph changes: older exports are then ignored
FINGERPRINT_BYTES = 1 << 20  # of each weights file: its first and last MiB, with its size
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# One forward pass holds at most this many attention cells (rows x padded length²): ONNX Runtime's memory
# arena keeps its largest pass's memory for the process's life, and 16 chunks of 256 word pieces in one pass
# left it 300 MB up (4 rows: 80 MB), no faster (docs/benchmarks.md, "One large document"). Short texts
# (queries, sentences) still run in whole batches.
ATTENTION_CELLS_PER_RUN = 4 * 256 * 256
STALE_PARTIAL_S = 3600  # an export takes about 30 s; a partial file this old belongs to a stopped one


def default_export_root() -> Path:
    """Where exports live unless EMBEDDING_ONNX_DIR says otherwise: beside the installed packages."""
    return Path(sys.prefix) / "share" / "iris-rag" / "onnx"


def model_fingerprint(model_path: str | Path) -> str:
    """A cheap digest of a local model folder: every small file whole, big weights by size, head and tail.

    Cheap because the worker computes it at start, before the first answer; enough because a changed
    model changes its config, its tokenizer or its weights' size and bytes.
    """
    digest = hashlib.sha256(f"format {EXPORT_FORMAT}".encode())
    root = Path(model_path)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(".") or "/." in relative:
            continue
        size = path.stat().st_size
        digest.update(f"{relative}\0{size}\0".encode())
        with path.open("rb") as handle:
            if size <= 2 * FINGERPRINT_BYTES:
                digest.update(handle.read())
            else:
                digest.update(handle.read(FINGERPRINT_BYTES))
                handle.seek(size - FINGERPRINT_BYTES)
                digest.update(handle.read(FINGERPRINT_BYTES))
    return digest.hexdigest()[:24]


def export_folder(model_path: str | Path, root: Path | None = None) -> Path:
    """The folder an export of this model has (or would have)."""
    return (root or default_export_root()) / model_fingerprint(model_path)


def find_export(model_path: str | Path, root: Path | None = None) -> Path | None:
    """The exported ONNX file for this model, or None when it was never exported (or the model changed)."""
    folder = export_folder(model_path, root)
    onnx_path = folder / ONNX_FILE
    return onnx_path if onnx_path.is_file() and (folder / MANIFEST_FILE).is_file() else None


def pooling_config(model_path: str | Path) -> tuple[int, bool]:
    """The model's max_seq_length and whether it is transformer -> mean pooling -> normalize.

    A folder without sentence-transformers' config files is not (0, False): it keeps the torch backend.
    """
    root = Path(model_path)
    try:
        max_length = int(json.loads((root / "sentence_bert_config.json").read_text())["max_seq_length"])
        modules = json.loads((root / "modules.json").read_text())
        kinds = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
        if kinds != ["Transformer", "Pooling", "Normalize"]:
            return max_length, False
        pooling = json.loads((root / modules[1]["path"] / "config.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return 0, False
    modes = [key for key, value in pooling.items() if key.startswith("pooling_mode") and value]
    return max_length, modes == ["pooling_mode_mean_tokens"]


def export(model_path: str | Path, root: Path | None = None) -> Path:
    """Export the model's transformer to ONNX (torch is needed here only); returns the ONNX file."""
    _, mean_pooled = pooling_config(model_path)
    if not mean_pooled:
        msg = f"{model_path} is not transformer -> mean pooling -> normalize; it keeps the torch backend"
        raise ValueError(msg)
    import torch
    from sentence_transformers import SentenceTransformer

    folder = export_folder(model_path, root)
    folder.mkdir(parents=True, exist_ok=True)
    model = SentenceTransformer(str(model_path), device="cpu")
    transformer: Any = model[0].auto_model
    transformer.eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.transformer(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    example = model.tokenizer(["an example", "a longer example text"], padding=True, return_tensors="pt")
    axes = {0: "batch", 1: "sequence"}
    # Written under a name of this process's own and renamed: a reader never sees half a file, and two
    # processes exporting at once (two first starts) never write into one file.
    _remove_stale_partials(folder)
    partial = folder / f"{ONNX_FILE}.{os.getpid()}.partial"
    with torch.inference_mode():
        torch.onnx.export(
            LastHiddenState(),
            tuple(example[name] for name in INPUTS),
            str(partial),
            input_names=list(INPUTS),
            output_names=["last_hidden_state"],
            dynamic_axes={**{name: axes for name in INPUTS}, "last_hidden_state": axes},
            opset_version=OPSET,
            dynamo=False,
        )
    partial.replace(folder / ONNX_FILE)
    manifest = {"model": str(model_path), "format": EXPORT_FORMAT, "opset": OPSET, "torch": torch.__version__}
    partial_manifest = folder / f"{MANIFEST_FILE}.{os.getpid()}.partial"
    partial_manifest.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    partial_manifest.replace(folder / MANIFEST_FILE)
    return folder / ONNX_FILE


def _remove_stale_partials(folder: Path) -> None:
    """Files left by an export whose process was stopped mid-way (a short first session), after an hour."""
    for path in folder.glob("*.partial"):
        with contextlib.suppress(OSError):
            if time.time() - path.stat().st_mtime > STALE_PARTIAL_S:
                path.unlink()


@dataclass(frozen=True, slots=True)
class QueryStates:
    """A query's unit embedding with the word-piece ids and last hidden state it was pooled from."""

    vector: npt.NDArray[np.float32]
    token_ids: npt.NDArray[np.int64]
    states: npt.NDArray[np.float32]


class OnnxModel:
    """The dense half of a sentence-transformers model: the same encode() call, on ONNX Runtime.

    One instance is used by one thread at a time (the tokenizer's padding and truncation are its state).
    """

    def __init__(self, model_path: str | Path, onnx_path: Path, *, threads: int) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        self.max_seq_length, mean_pooled = pooling_config(model_path)
        if not mean_pooled:
            msg = f"{model_path} is not transformer -> mean pooling -> normalize"
            raise ValueError(msg)
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle pool threads sleep rather than spin: spinning takes the cores that queries, SQL and the
        # other processes of a small machine need (the reason torch runs a query on one thread).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.threads = threads
        self.onnx_path = onnx_path
        self.session = onnxruntime.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self._input_names = {i.name for i in self.session.get_inputs()}
        self._tokenizer_file = Path(model_path) / "tokenizer.json"
        self._tokenizer = Tokenizer.from_file(str(self._tokenizer_file))
        # As sentence-transformers calls its tokenizer: cut at max_seq_length, padded to the longest text.
        self._tokenizer.enable_truncation(max_length=self.max_seq_length)
        padding = self._tokenizer.padding or {}
        pad_token = str(padding.get("pad_token", "[PAD]"))
        pad_id = self._tokenizer.token_to_id(pad_token)
        self._tokenizer.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token=pad_token)
        self._counter = Tokenizer.from_file(str(self._tokenizer_file))
        self._counter.no_truncation()
        self._counter.no_padding()
        self.dimension = int(self.session.get_outputs()[0].shape[-1])

    def copy(self, *, threads: int) -> OnnxModel:
        """Another session over the same files (for another thread, with its own thread count)."""
        return OnnxModel(self._tokenizer_file.parent, self.onnx_path, threads=threads)

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int = 32,
        normalize_embeddings: bool = True,
        convert_to_numpy: bool = True,
        show_progress_bar: bool = False,
    ) -> npt.NDArray[np.float32]:
        """Unit-length embeddings, as SentenceTransformer.encode gives with the same arguments."""
        del convert_to_numpy, show_progress_bar  # always NumPy, never a progress bar
        # Longest first in batches, as sentence-transformers does, so a batch pads little.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        rows: list[npt.NDArray[np.float32]] = []
        for start in range(0, len(order), batch_size):
            batch = [texts[i].strip() for i in order[start : start + batch_size]]
            rows.append(self._embed(batch, normalize=normalize_embeddings))
        result = np.empty((len(texts), self.dimension), dtype=np.float32)
        if rows:
            result[order] = np.concatenate(rows)
        return result

    def _embed(self, texts: list[str], *, normalize: bool) -> npt.NDArray[np.float32]:
        encodings = self._tokenizer.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        inputs = {k: v for k, v in feeds.items() if k in self._input_names}
        length = feeds["input_ids"].shape[1]
        rows = max(1, ATTENTION_CELLS_PER_RUN // (length * length))
        hidden = np.concatenate(
            [
                self.session.run(None, {k: v[start : start + rows] for k, v in inputs.items()})[0]
                for start in range(0, len(encodings), rows)
            ]
        )
        # Mean pooling over the real tokens, then unit length: sentence-transformers' Pooling and Normalize.
        mask = feeds["attention_mask"][:, :, None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        if normalize:
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        result: npt.NDArray[np.float32] = pooled.astype(np.float32, copy=False)
        return result

    def encode_with_states(self, text: str) -> QueryStates:
        """One text's embedding and, from the same forward pass, its word-piece ids and last hidden state.

        The embedding is exactly what encode([text]) returns: one text is never padded.
        """
        encoding = self._tokenizer.encode(text.strip())
        feeds = {
            "input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
        }
        hidden = self.session.run(None, {k: v for k, v in feeds.items() if k in self._input_names})[0][0]
        states = np.ascontiguousarray(hidden, dtype=np.float32)
        pooled = states.mean(axis=0)
        vector = (pooled / max(float(np.linalg.norm(pooled)), 1e-12)).astype(np.float32)
        return QueryStates(vector, feeds["input_ids"][0], states)

    def word_piece_counts(self, texts: list[str]) -> list[int]:
        """Word pieces per text, without special tokens or truncation (the tokenizer's tokenize())."""
        return [len(e.tokens) for e in self._counter.encode_batch(texts, add_special_tokens=False)]
