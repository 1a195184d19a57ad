"""Token vectors for late interaction (rag_colbert): encoded at ingest, compressed, one BLOB per chunk.

Each chunk's text (title + chunk, as embedded for dense search) goes through the embedding model's
transformer; the last hidden state of every word piece, minus special and punctuation tokens, is
unit-normalized, projected to TOKEN_DIMENSION dimensions by a fixed orthonormal projection, normalized
again and int8-quantized with one scale per chunk. The word-piece ids are kept next to the vectors
(uint16): they order a chunk's tokens by informativeness at query time (collection IDF, from the
document-frequency table this index keeps) and name the tokens that matched.

Stored per token: TOKEN_DIMENSION bytes of codes + 2 bytes of id; per chunk: a 4-byte scale.
"""

from __future__ import annotations

import math
import threading
import unicodedata
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.encoder import TextEncoder
from iris_rag.onnx_model import QueryStates
from iris_rag.stores.base import DocumentInput, DocumentStore
from iris_rag.stores.technique_index import ChunkEncoding
from iris_rag.techniques.colbert.storage import TokenRow, TokenVectorStorage
from iris_rag.text import chunk_id, embedding_text

TOKEN_DIMENSION = 96
"""Dimensions kept per token vector after projection (int8 each)."""
MAX_DOCUMENT_TOKENS = 512
"""Word pieces encoded per chunk (the model's position limit); longer chunks are cut."""
QUERY_MAX_TOKENS = 256
"""Word pieces of a query encode_query_shared's torch fallback keeps (the packaged model's max_seq_length)."""
PROJECTION_SEED = 20240611
"""Seed of the fixed random orthonormal projection: the same for every collection and every run."""

Floats = npt.NDArray[np.float32]
Ids = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TokenVectors:
    """One text's kept word pieces: their ids and unit vectors in the projected space, in text order."""

    token_ids: Ids
    vectors: Floats
    truncated: bool = False
    # The text's dense embedding from the same pass (encode(with_dense=True)), when it is exact; else None.
    dense: Floats | None = None
    # One row per span asked for (encode(spans=...)): the unit mean of the hidden states of the word pieces
    # inside the span, a NaN row where the span lies beyond the cut or covers no word piece; else None.
    pooled: Floats | None = None


@dataclass(frozen=True, slots=True)
class ChunkTokens:
    """A chunk's stored token vectors, as read back: int8 codes times one scale."""

    chunk_id: str
    document_id: str
    token_ids: Ids
    codes: npt.NDArray[np.int8]
    scale: float

    @property
    def token_count(self) -> int:
        """How many token vectors are stored for the chunk."""
        return int(self.token_ids.shape[0])

    def vectors(self) -> Floats:
        """The dequantized vectors (rows of unit length up to quantization error)."""
        result: Floats = self.codes.astype(np.float32) * np.float32(self.scale)
        return result


@dataclass(frozen=True, slots=True)
class PreparedChunk:
    """One row to write: a chunk's quantized token vectors."""

    document_id: str
    chunk_id: str
    token_ids: bytes
    codes: bytes
    scale: float
    token_count: int
    truncated: bool


def quantize(vectors: Floats) -> tuple[npt.NDArray[np.int8], float]:
    """Symmetric int8 quantization with one scale: the largest magnitude maps to 127."""
    peak = float(np.abs(vectors).max()) if vectors.size else 0.0
    scale = peak / 127.0 if peak > 0 else 1.0
    codes = np.clip(np.rint(vectors / scale), -127, 127).astype(np.int8)
    return codes, scale


def orthonormal_projection(source: int, target: int, seed: int = PROJECTION_SEED) -> Floats:
    """A fixed random source x target matrix with orthonormal columns (Johnson-Lindenstrauss style)."""
    if target >= source:
        return np.eye(source, dtype=np.float32)
    gaussian = np.random.default_rng(seed).standard_normal((source, target))
    q, r = np.linalg.qr(gaussian)
    # Fix the signs so the matrix is unique for the seed whatever the LAPACK build.
    q = q * np.sign(np.diag(r))
    return np.ascontiguousarray(q, dtype=np.float32)


def _unit(rows: Floats) -> Floats:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    result: Floats = (rows / np.maximum(norms, 1e-12)).astype(np.float32)
    return result


def _is_punctuation(token: str) -> bool:
    text = token.removeprefix("##")
    return bool(text) and all(unicodedata.category(ch)[0] in "PS" for ch in text)


class TokenEncoder:
    """Word-piece vectors from the shared embedding model's transformer (its last hidden state)."""

    def __init__(self, embedder: TextEncoder, dimension: int = TOKEN_DIMENSION) -> None:
        self.embedder = embedder
        self.dimension = dimension
        self._lock = threading.Lock()
        self._projection: Floats | None = None
        self._skip: npt.NDArray[np.bool_] | None = None

    def _setup(self) -> tuple[Floats, npt.NDArray[np.bool_]]:
        with self._lock:
            if self._projection is None or self._skip is None:
                tokenizer = self.embedder.tokenizer
                tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
                skip = np.array([_is_punctuation(str(t)) for t in tokens], dtype=bool)
                skip[list(tokenizer.all_special_ids)] = True
                self._skip = skip
                self._projection = orthonormal_projection(self.embedder.dimension, self.dimension)
            return self._projection, self._skip

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        """The word pieces the ids stand for ('##' marks a continuation)."""
        return [str(t) for t in self.embedder.tokenizer.convert_ids_to_tokens([int(i) for i in token_ids])]

    @property
    def vocabulary_size(self) -> int:
        """How many word-piece ids the tokenizer has."""
        return len(self.embedder.tokenizer)

    def encode(
        self,
        texts: list[str],
        *,
        max_length: int = MAX_DOCUMENT_TOKENS,
        batch_size: int | None = None,
        with_dense: bool = False,
        spans: Sequence[Sequence[tuple[int, int]]] | None = None,
    ) -> list[TokenVectors]:
        """Each text's kept word pieces (no special or punctuation tokens), projected and unit-length.

        Bulk work on the encode thread (Embedder.map_bulk): in slices, behind every query's encode.
        `with_dense`: also give each text's dense embedding from the same hidden state, where that is
        exactly what Embedder.encode computes (see dense_from_hidden); the ingest then skips its own pass.
        `spans`: per text, character spans [start, end) of the text whose word pieces' hidden states are
        mean-pooled (see pool_spans) into TokenVectors.pooled: sentence vectors from the same pass.
        """
        if not texts:
            return []
        if spans is not None and len(spans) != len(texts):
            msg = f"{len(spans)} span lists for {len(texts)} texts"
            raise ValueError(msg)
        projection, skip = self._setup()
        batch = batch_size or self.embedder.batch_size
        results: list[TokenVectors | None] = [None] * len(texts)

        def run(model: Any, order: list[int]) -> None:
            import torch

            transformer = model[0].auto_model
            tokenizer = model.tokenizer  # the model this runs on's own (see encode_query)
            dense_limit = _dense_limit(model, max_length) if with_dense else 0
            with torch.inference_mode():
                for start in range(0, len(order), batch):
                    positions = order[start : start + batch]
                    encoded = tokenizer(
                        # Stripped, as sentence-transformers does, so both passes see the same ids.
                        [texts[i].strip() for i in positions],
                        padding=True,
                        truncation=True,
                        max_length=max_length,
                        return_tensors="pt",
                        return_overflowing_tokens=False,
                        return_length=False,
                        return_offsets_mapping=spans is not None,
                    )
                    offsets = encoded.pop("offset_mapping").numpy() if spans is not None else None
                    inputs = {k: v.to(transformer.device) for k, v in encoded.items()}
                    hidden = transformer(**inputs).last_hidden_state.float().cpu().numpy()
                    ids = encoded["input_ids"].numpy()
                    mask = encoded["attention_mask"].numpy().astype(bool)
                    for row, position in enumerate(positions):
                        row_ids = ids[row][mask[row]].astype(np.int64)
                        keep = ~skip[row_ids]
                        states = hidden[row][mask[row]]
                        pooled = None
                        if spans is not None and offsets is not None:
                            # Offsets are into the stripped text: shift the spans by what strip() took.
                            shift = len(texts[position]) - len(texts[position].lstrip())
                            wanted = [(a - shift, b - shift) for a, b in spans[position]]
                            cut = bool(mask[row].all()) and len(row_ids) >= max_length
                            pooled = pool_spans(states, offsets[row][mask[row]], wanted, cut=cut)
                        vectors = _unit(states[keep])
                        projected = _unit(vectors @ projection) if vectors.size else vectors[:, :0]
                        results[position] = TokenVectors(
                            row_ids[keep],
                            np.ascontiguousarray(projected.reshape(-1, self.dimension), dtype=np.float32),
                            truncated=bool(mask[row].all()) and len(row_ids) >= max_length,
                            dense=dense_from_hidden(states) if len(row_ids) < dense_limit else None,
                            pooled=pooled,
                        )

        # Similar lengths sliced and batched together: padding is wasted work.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        self.embedder.map_bulk(run, order, cost=lambda i: len(texts[i]))
        return [r for r in results if r is not None]

    def encode_query(self, query: str, *, max_length: int) -> Future[QueryEncoding]:
        """One forward pass of the query for both its token vectors and its dense embedding.

        The dense embedding is the mean of the same last hidden state, normalized: exactly what
        Embedder.encode_query computes (up to float rounding) when the model is mean-pooled and normalized
        and the query fits both length limits; otherwise `dense` is None and the caller embeds it apart.
        """
        projection, skip = self._setup()

        def run(model: Any) -> QueryEncoding:
            import torch

            transformer = model[0].auto_model
            # The tokenizer of the model this runs on (the query thread's copy): the bulk model's, called
            # from here while a bulk encode pads a batch with it, broke that batch ("Unable to create
            # tensor"; issue 11, defect 9). sentence-transformers strips the text first; so must this.
            tokenizer = model.tokenizer
            encoded = tokenizer([query.strip()], truncation=True, max_length=max_length, return_tensors="pt")
            with torch.inference_mode():
                inputs = {k: v.to(transformer.device) for k, v in encoded.items()}
                hidden = transformer(**inputs).last_hidden_state[0].float().cpu().numpy()
            ids = encoded["input_ids"][0].numpy().astype(np.int64)
            keep = ~skip[ids]
            vectors = _unit(hidden[keep])
            projected = _unit(vectors @ projection) if vectors.size else vectors[:, :0]
            tokens = TokenVectors(
                ids[keep],
                np.ascontiguousarray(projected.reshape(-1, self.dimension), dtype=np.float32),
                truncated=len(ids) >= max_length,
            )
            exact = len(ids) < _dense_limit(model, max_length)
            return QueryEncoding(dense_from_hidden(hidden) if exact else None, tokens)

        return self.embedder.run_with_model(run, single=True)

    def encode_query_shared(self, query: str) -> Future[QueryEncoding]:
        """The query's token vectors and dense vector from the dense encoder's own forward pass.

        Under the onnx backend that is the ONNX session encode_query_async runs (one pass gives both, and
        the vector is remembered for later encodes of the query); otherwise encode_query on the torch
        model, cut at the model's max_seq_length as the dense encode is.
        """
        shared = self.embedder.encode_query_states_async(query)
        if shared is None:
            return self.encode_query(query, max_length=QUERY_MAX_TOKENS)
        projection, skip = self._setup()
        result: Future[QueryEncoding] = Future()

        def settle(done: Future[QueryStates]) -> None:
            try:
                states = done.result()
            except BaseException as error:  # handed to the caller's result()
                result.set_exception(error)
                return
            keep = ~skip[states.token_ids]
            vectors = _unit(states.states[keep])
            projected = _unit(vectors @ projection) if vectors.size else vectors[:, :0]
            tokens = TokenVectors(
                states.token_ids[keep],
                np.ascontiguousarray(projected.reshape(-1, self.dimension), dtype=np.float32),
                truncated=len(states.token_ids) >= QUERY_MAX_TOKENS,
            )
            result.set_result(QueryEncoding(states.vector, tokens))

        shared.add_done_callback(settle)
        return result


@dataclass(frozen=True, slots=True)
class QueryEncoding:
    """A query's token vectors and, when one forward pass could give it exactly, its dense embedding."""

    dense: Floats | None
    tokens: TokenVectors


def dense_from_hidden(states: Floats) -> Floats:
    """A text's sentence embedding from its unpadded last hidden state: mean over every token, unit length.

    Equal (up to float rounding) to what Embedder.encode returns when the model is transformer → mean
    pooling → normalize (_mean_pooled) and the text was not cut shorter than the model would cut it.
    """
    mean = states.mean(axis=0)
    dense: Floats = (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)
    return dense


def pool_spans(
    states: Floats, offsets: npt.NDArray[np.int64], spans: Sequence[tuple[int, int]], *, cut: bool
) -> Floats:
    """One unit row per span: the mean hidden state of the word pieces whose characters lie in the span.

    `states` and `offsets` are one text's unpadded last hidden state and its tokenizer offsets (special
    tokens have empty offsets and are never pooled). In a text that was `cut` (truncated), a span is
    pooled only when it ends where the last word piece kept ends or before; otherwise its row is NaN, and
    so is the row of a span holding no word piece: the caller embeds that sentence apart.
    """
    pooled = np.full((len(spans), states.shape[1]), np.nan, dtype=np.float32)
    real = offsets[:, 1] > offsets[:, 0]
    reached = (int(offsets[real, 1].max()) if real.any() else 0) if cut else math.inf
    for row, (start, end) in enumerate(spans):
        inside = real & (offsets[:, 0] < end) & (offsets[:, 1] > start)
        if end <= reached and inside.any():
            mean = states[inside].mean(axis=0)
            pooled[row] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return pooled


def _dense_limit(model: Any, max_length: int) -> int:
    """Below this many word pieces, a text's hidden states give its exact dense embedding (0: never).

    Both cuts must leave the text whole: this pass's max_length and the model's own max_seq_length.
    """
    return min(max_length, model.max_seq_length) if _mean_pooled(model) else 0


def _mean_pooled(model: Any) -> bool:
    """Whether the sentence-transformers model is transformer → mean pooling → normalize, nothing else."""
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    modules = list(model)
    return (
        len(modules) == 3
        and isinstance(modules[0], Transformer)
        and not getattr(modules[0], "do_lower_case", False)
        and isinstance(modules[1], Pooling)
        and modules[1].get_config_dict().get("pooling_mode") == "mean"
        and isinstance(modules[2], Normalize)
    )


class TokenVectorIndex:
    """The TechniqueIndex of rag_colbert: per-chunk token vectors and the collection's token frequencies."""

    name = "colbert_tokens"

    def __init__(self, encoder: TokenEncoder, store: DocumentStore) -> None:
        self.encoder = encoder
        self.rows = store.technique_storage(TokenVectorStorage)

    def encode_chunks(
        self, texts: list[str], spans: list[list[tuple[int, int]]] | None = None
    ) -> list[ChunkEncoding]:
        """The ingest's one forward pass: token vectors, dense vectors where exact, pooled spans if asked.

        The token vectors go to prepare(); the hidden states pooled over `spans` (a SpanPooling index's
        sentences) to that index.
        """
        encoded = self.encoder.encode(texts, with_dense=True, spans=spans)
        return [ChunkEncoding(t.dense, t, t.pooled) for t in encoded]

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> list[PreparedChunk]:
        """Quantize each chunk's token vectors (title + chunk text, as embedded); encode those not given."""
        chunks = [(d, c) for d in documents for c in d.chunks]
        keys = [(d.id, chunk_id(d.id, c.index)) for d, c in chunks]
        given = [_given_tokens(c.tokens) for _, c in chunks]
        todo = [i for i, tokens in enumerate(given) if tokens is None]
        texts = [embedding_text(chunks[i][0].title, chunks[i][1].content) for i in todo]
        for i, tokens in zip(todo, self.encoder.encode(texts), strict=True):
            given[i] = tokens
        encoded = [t for t in given if t is not None]
        id_type = np.uint16 if self.encoder.vocabulary_size <= 1 << 16 else np.uint32
        prepared = []
        for (document_id, key), tokens in zip(keys, encoded, strict=True):
            codes, scale = quantize(tokens.vectors)
            prepared.append(
                PreparedChunk(
                    document_id,
                    key,
                    tokens.token_ids.astype(id_type).tobytes(),
                    codes.tobytes(),
                    scale,
                    int(tokens.token_ids.shape[0]),
                    tokens.truncated,
                )
            )
        return prepared

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Insert the chunks' rows and add their word pieces to the collection's chunk frequencies."""
        wanted = {d.id for d in documents}  # fewer than prepared when the background builder skips some
        chunks: list[PreparedChunk] = [c for c in prepared if c.document_id in wanted]
        dimension = self.encoder.dimension
        self.rows.insert(
            collection_id,
            [
                TokenRow(c.chunk_id, c.document_id, c.token_count, dimension, c.scale, c.token_ids, c.codes)
                for c in chunks
            ],
        )
        counts: Counter[int] = Counter()
        for c in chunks:
            counts.update(np.unique(self._ids(c.token_ids)).tolist())
        self.rows.add_frequencies(collection_id, dict(counts))

    def delete(self, collection_id: str, document_id: str) -> None:
        """Remove a document's rows and take its word pieces out of the chunk frequencies."""
        blobs = self.rows.document_token_ids(collection_id, document_id)
        if not blobs:
            return
        counts: Counter[int] = Counter()
        for blob in blobs:
            counts.update(np.unique(self._ids(blob)).tolist())
        self.rows.add_frequencies(collection_id, {token: -n for token, n in counts.items()})
        self.rows.delete_document(collection_id, document_id)

    def _ids(self, blob: bytes) -> Ids:
        id_type = np.uint16 if self.encoder.vocabulary_size <= 1 << 16 else np.uint32
        return np.frombuffer(blob, dtype=id_type).astype(np.int64)

    def stats(self) -> dict[str, Any]:
        """Rows, tokens and bytes of the token store (every collection), for health details."""
        totals = self.rows.totals()
        chunks, tokens, size = totals.chunks, totals.tokens, totals.bytes
        return {
            "chunks": chunks,
            "documents": totals.documents,
            "tokens": tokens,
            "bytes": size,
            "bytes_per_chunk": round(size / chunks, 1) if chunks else 0.0,
            "bytes_per_token": round(size / tokens, 2) if tokens else 0.0,
            "dimension": self.encoder.dimension,
            "encoding": "int8 codes, one float scale per chunk, uint16 word-piece ids",
        }

    def indexed_documents(self, collection_id: str) -> int:
        """Distinct documents with token rows in the collection."""
        return self.rows.indexed_documents(collection_id)

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents with token rows."""
        return self.rows.indexed_document_ids(collection_id)

    def load(self, collection_id: str, chunk_ids: list[str]) -> dict[str, ChunkTokens]:
        """The stored token vectors of the given chunks (chunks without rows are left out)."""
        found: dict[str, ChunkTokens] = {}
        for row in self.rows.load(collection_id, chunk_ids):
            codes = np.frombuffer(row.codes, dtype=np.int8).reshape(-1, row.dimension)
            found[row.chunk_id] = ChunkTokens(
                row.chunk_id, row.document_id, self._ids(row.token_ids), codes, row.scale
            )
        return found

    def frequencies(self, collection_id: str) -> tuple[int, dict[int, int]]:
        """How many chunks have token rows, and in how many of them each word piece occurs."""
        return self.rows.frequencies(collection_id)

    def indexed_chunks(self, collection_id: str) -> int:
        """How many chunks have token rows."""
        return self.rows.indexed_chunks(collection_id)


def _given_tokens(tokens: Any) -> TokenVectors | None:
    """The token vectors the ingest's shared pass gave a chunk (ChunkInput.tokens), if any."""
    if isinstance(tokens, ChunkEncoding):
        tokens = tokens.tokens
    return tokens if isinstance(tokens, TokenVectors) else None


def used_count(token_count: int, ratio: float) -> int:
    """How many of a chunk's tokens a compression ratio keeps: ceil(ratio * n), at least 1 if any."""
    if token_count == 0:
        return 0
    return max(1, min(token_count, math.ceil(ratio * token_count - 1e-9)))
