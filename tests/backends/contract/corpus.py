"""Building documents for the contract tests: unit vectors and one-chunk-per-sentence documents."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.stores.base import ChunkInput, DocumentInput, DocumentStore

DIM = 8
MODEL = "contract-model"

Vector = npt.NDArray[np.float32]


def unit_vector(seed: int, dimension: int = DIM) -> Vector:
    """A reproducible random vector of length 1."""
    v: Vector = np.random.default_rng(seed).normal(size=dimension).astype(np.float32)
    unit: Vector = v / np.float32(np.linalg.norm(v))
    return unit


def unit_rows(rows: int, dimension: int, seed: int) -> Vector:
    """A matrix of reproducible random unit rows."""
    m: Vector = np.random.default_rng(seed).normal(size=(rows, dimension)).astype(np.float32)
    unit: Vector = m / np.linalg.norm(m, axis=1, keepdims=True).astype(np.float32)
    return unit


def document(
    doc_id: str,
    chunks: list[str],
    title: str = "",
    metadata: dict[str, Any] | None = None,
    vectors: list[Vector] | None = None,
) -> DocumentInput:
    """A document whose chunks are the given texts (content: them joined by a space)."""
    inputs, start = [], 0
    for i, text in enumerate(chunks):
        vector = vectors[i] if vectors is not None else unit_vector(zlib.crc32(f"{doc_id}#{i}".encode()))
        inputs.append(ChunkInput(i, text, start, start + len(text), vector))
        start += len(text) + 1
    return DocumentInput(doc_id, title, " ".join(chunks), metadata or {}, inputs)


def new_collection(store: DocumentStore, collection_id: str = "c", dimension: int = DIM) -> None:
    """Create an empty collection of the contract model."""
    store.create_collection(collection_id, MODEL, dimension)
