"""rag_colbert's token-vector index: encoding, compression, budget, and rows that follow the documents."""

import threading
from collections import Counter
from typing import Any

import numpy as np
import pytest

from iris_rag.embedder import Embedder
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.stores.base import DocumentInput
from iris_rag.techniques.colbert.index import (
    TOKEN_DIMENSION,
    TokenEncoder,
    TokenVectorIndex,
    orthonormal_projection,
    quantize,
    used_count,
)
from iris_rag.techniques.colbert.storage import TokenRow, TokenVectorStorage
from tests.conftest import DOCUMENTS


def _index(service: RagService) -> TokenVectorIndex:
    index = service.pipelines["colbert"].technique_index()
    assert isinstance(index, TokenVectorIndex)
    return index


def _stored(service: RagService) -> list[TokenRow]:
    """Every token row of the 'docs' collection, read through the storage contract."""
    store = service.store
    chunk_ids = [c.chunk_id for d in store.document_ids("docs") for c in store.get_document_chunks("docs", d)]
    # Ask for a few chunk ids that have no row too: they are left out.
    return store.technique_storage(TokenVectorStorage).load("docs", [*chunk_ids, "absent#0"])


def _rows(service: RagService) -> dict[str, tuple[str, int]]:
    return {r.chunk_id: (r.document_id, r.token_count) for r in _stored(service)}


def _frequencies_match_rows(service: RagService) -> None:
    """The document-frequency table equals a recount over the stored rows."""
    recount: Counter[int] = Counter()
    for row in _stored(service):
        recount.update(np.unique(np.frombuffer(row.token_ids, dtype=np.uint16)).tolist())
    total, frequencies = _index(service).frequencies("docs")
    assert frequencies == dict(recount)
    assert total == len(_rows(service))


def test_quantize_and_projection() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((40, TOKEN_DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    codes, scale = quantize(vectors)
    assert codes.dtype == np.int8 and int(np.abs(codes).max()) == 127
    assert scale == pytest.approx(float(np.abs(vectors).max()) / 127)
    assert np.abs(codes * scale - vectors).max() <= scale / 2 + 1e-6
    projection = orthonormal_projection(384, TOKEN_DIMENSION)
    assert projection.shape == (384, TOKEN_DIMENSION)
    np.testing.assert_allclose(projection.T @ projection, np.eye(TOKEN_DIMENSION), atol=1e-5)
    np.testing.assert_array_equal(projection, orthonormal_projection(384, TOKEN_DIMENSION))
    assert used_count(10, 0.1) == 1 and used_count(10, 0.8) == 8 and used_count(9, 0.8) == 8
    assert used_count(3, 0.1) == 1 and used_count(0, 0.5) == 0


def test_encoder_drops_special_and_punctuation_tokens(embedder: Embedder) -> None:
    encoder = TokenEncoder(embedder)
    tokens = encoder.encode(["Aspirin, daily!", "Volcanoes erupt."])
    assert encoder.token_strings(tokens[0].token_ids.tolist()) == ["as", "##pi", "##rin", "daily"]
    assert encoder.token_strings(tokens[1].token_ids.tolist()) == ["volcanoes", "er", "##upt"]
    for item in tokens:
        assert item.vectors.shape == (len(item.token_ids), TOKEN_DIMENSION)
        np.testing.assert_allclose(np.linalg.norm(item.vectors, axis=1), 1.0, atol=1e-5)
    # Token vectors are contextual: the same word piece differs with its neighbours.
    bank = encoder.encode(["river bank", "bank loan"])
    assert float(bank[0].vectors[1] @ bank[1].vectors[0]) < 0.99
    long = encoder.encode([" ".join(["word"] * 600)], max_length=64)[0]
    assert len(long.token_ids) == 62 and long.truncated


def test_one_query_forward_pass_gives_the_dense_vector_and_the_tokens(embedder: Embedder) -> None:
    encoder = TokenEncoder(embedder)
    for query in ["Does aspirin lower the risk of heart attacks?", "  volcanoes erupt  "]:
        encoding = encoder.encode_query(query, max_length=256).result()
        assert encoding.dense is not None
        np.testing.assert_allclose(encoding.dense, embedder.encode_query(query), atol=1e-5)
        separate = encoder.encode([query.strip()], max_length=256)[0]
        np.testing.assert_array_equal(encoding.tokens.token_ids, separate.token_ids)
        np.testing.assert_allclose(encoding.tokens.vectors, separate.vectors, atol=1e-5)
    # Cut at max_length, the hidden states are not those of the whole query: no dense vector from them.
    truncated = encoder.encode_query(" ".join(["word"] * 100), max_length=32).result()
    assert truncated.dense is None and truncated.tokens.truncated and len(truncated.tokens.token_ids) == 30


def test_rows_follow_ingest_replace_delete(service: RagService) -> None:
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    rows = _rows(service)
    chunk_ids = {
        c.chunk_id for d in DOCUMENTS for c in service.store.get_document_chunks("docs", str(d["id"]))
    }
    assert set(rows) == chunk_ids, "one row per stored chunk, under the store's chunk id"
    assert _index(service).indexed_documents("docs") == 3
    _frequencies_match_rows(service)
    before = rows["volcano#0"][1]

    service.ingest(
        {"collection_id": "docs", "documents": [{"id": "volcano", "content": "Glaciers carve deep valleys."}]}
    )
    after = _rows(service)
    assert after["volcano#0"][1] != before and after["volcano#0"][1] == 5
    _frequencies_match_rows(service)
    loaded = _index(service).load("docs", ["volcano#0"])["volcano#0"]
    words = _index(service).encoder.token_strings(loaded.token_ids.tolist())
    assert words == ["glaciers", "car", "##ve", "deep", "valleys"]

    assert service.store.delete_document("docs", "volcano")
    assert {doc for doc, _ in _rows(service).values()} == {"aspirin", "sourdough"}
    assert _index(service).indexed_documents("docs") == 2
    _frequencies_match_rows(service)
    glacier = int(_index(service).encoder.embedder.tokenizer.convert_tokens_to_ids("glaciers"))
    assert glacier not in _index(service).frequencies("docs")[1], "a word piece no chunk holds any more"


class _FailingIndex:
    """Registered after the token index: its write fails, so the whole ingest must roll back."""

    name = "failing"

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> None:
        return None

    def write(self, collection_id: str, documents: Any, prepared: Any) -> None:
        raise RuntimeError("index failure")

    def delete(self, collection_id: str, document_id: str) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def indexed_documents(self, collection_id: str) -> int:
        return 0


def test_failed_ingest_leaves_token_rows_untouched(service: RagService) -> None:
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    before = _rows(service)
    failing = _FailingIndex()
    service.store.register_index(failing)
    service.ingestor.technique_indexes.append(failing)
    with pytest.raises(RuntimeError, match="index failure"):
        service.ingestor.ingest(
            "docs",
            [SourceDocument("volcano", "Glaciers carve valleys."), SourceDocument("new", "A new one.")],
        )
    assert _rows(service) == before
    _frequencies_match_rows(service)


def test_stats_report_the_store_size_within_the_budget(service: RagService) -> None:
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    stats = service.store.stats()["technique_indexes"]["colbert_tokens"]
    rows = _rows(service)
    tokens = sum(n for _, n in rows.values())
    assert stats["chunks"] == len(rows) and stats["documents"] == 3 and stats["tokens"] == tokens
    assert stats["bytes"] == tokens * (TOKEN_DIMENSION + 2) + 8 * len(rows)
    assert stats["bytes_per_token"] <= 128, "the budget: at most 128 bytes per stored token"
    assert stats["bytes_per_chunk"] == pytest.approx(stats["bytes"] / len(rows), abs=0.1)
    health = service.health_check({"include_details": True})
    assert health["components"]["vector_store"]["details"]["technique_indexes"]["colbert_tokens"] == stats


def test_ingest_takes_dense_vectors_from_the_token_pass(service: RagService, monkeypatch: Any) -> None:
    """With rag_colbert served, each chunk goes through the model once; the dense vectors are the same."""
    import hashlib

    from iris_rag.text import embedding_text

    dense_calls: list[list[str]] = []
    encode = service.embedder.encode

    def spy(texts: list[str], **kwargs: Any) -> Any:
        dense_calls.append(list(texts))
        return encode(texts, **kwargs)

    monkeypatch.setattr(service.embedder, "encode", spy)
    # 600 word pieces in one chunk: longer than the model's 256, so its dense vector is the model's own cut.
    long_text = "x, " * 300
    documents: list[dict[str, Any]] = [*DOCUMENTS, {"id": "long", "title": "", "content": long_text}]
    service.ingest({"collection_id": "docs", "documents": documents})

    texts = {
        chunk.chunk_id: embedding_text(str(d.get("title", "")), chunk.content)
        for d in documents
        for chunk in service.store.get_document_chunks("docs", str(d["id"]))
    }
    encoded_apart = {text for call in dense_calls for text in call}  # (NodeRAG's sentences are encoded too)
    assert texts["long#0"] in encoded_apart, "the model cuts it at 256: the token pass is not its embedding"
    short = [text for key, text in texts.items() if not key.startswith("long")]
    assert short and not encoded_apart.intersection(short), "a chunk that fits goes through the model once"
    model = service.settings.embedding_model
    hashes = {key: hashlib.sha256(text.encode("utf-8")).digest()[:16] for key, text in texts.items()}
    stored = service.store.cached_embeddings(model, list(hashes.values()))
    expected = encode(list(texts.values()))
    for row, key in enumerate(texts):
        np.testing.assert_allclose(stored[hashes[key]], expected[row], atol=1e-5)
    # The token rows are those a separate encode gives (up to int8 quantization).
    separate = _index(service).encoder.encode([texts["aspirin#0"]])[0]
    loaded = _index(service).load("docs", ["aspirin#0"])["aspirin#0"]
    np.testing.assert_array_equal(loaded.token_ids, separate.token_ids)
    np.testing.assert_allclose(loaded.vectors(), separate.vectors, atol=loaded.scale)


def test_a_query_encode_tokenizes_with_the_model_it_runs_on(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast tokenizer is not thread-safe: only the encode thread may call the bulk model's.

    The query encode runs on the query thread's model copy; it called the bulk model's tokenizer
    (Embedder.tokenizer), which a bulk encode may be padding a batch with at that moment ("Unable to
    create tensor", seen once while rag_colbert calls ran beside a background ColBERT build).
    """
    bulk_tokenizer = embedder.tokenizer
    threads: list[str] = []

    class Watched:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            threads.append(threading.current_thread().name)
            return bulk_tokenizer(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(bulk_tokenizer, name)

        def __len__(self) -> int:
            return len(bulk_tokenizer)

    monkeypatch.setattr(Embedder, "tokenizer", property(lambda _self: Watched()))
    encoder = TokenEncoder(embedder)
    encoded = encoder.encode_query("does aspirin prevent heart attacks", max_length=32).result()
    assert encoded.tokens.vectors.shape[0] > 0
    assert len(encoder.encode(["Aspirin and heart attacks."])) == 1  # bulk work
    assert [t for t in threads if t != "encode"] == []
