"""NodeRAG's sentence vectors from the chunks' own forward pass (issue 15 item 7).

With rag_colbert served, the ingest runs the model once per chunk; NodeRAG's leaf vectors are that pass's
hidden states mean-pooled over each sentence's word pieces. Checked here against a separate run of the
transformer over the same chunk text (tolerance 1e-5: float rounding of a different batch), and the
fallbacks: a sentence no chunk holds whole, or one past a chunk's cut, is embedded on its own as before.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from iris_rag.embedder import Embedder
from iris_rag.encoder import TextEncoder
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.colbert.index import TokenEncoder, pool_spans
from iris_rag.techniques.noderag.index import (
    NodeTreeIndex,
    build_tree,
    leaf_chunks,
    leaf_texts,
    pooling_spans,
)
from iris_rag.text import embedding_text

TITLE = "Aspirin"
CONTENT = (
    "Aspirin is an old drug. It came from willow bark.\n\n"
    "Low-dose aspirin prevents heart attacks. The effect is largest in older adults."
)


def _hidden(embedder: TextEncoder, text: str) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The transformer's last hidden state and the offsets for one text, run on its own (no batch)."""

    def run(model: Any) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        import torch

        encoded = model.tokenizer([text.strip()], return_tensors="pt", return_offsets_mapping=True)
        offsets = encoded.pop("offset_mapping")[0].numpy()
        with torch.inference_mode():
            hidden = model[0].auto_model(**encoded).last_hidden_state[0].float().numpy()
        return hidden, offsets

    return embedder.run_with_model(run).result()


def test_leaf_chunks_take_the_first_chunk_holding_the_sentence_whole() -> None:
    nodes = build_tree("One. Two. Three. Four.", "")  # sentences at 0-4, 5-9, 10-16, 17-22
    # Chunk 0 holds One, Two; chunk 1 (overlapping) Two, Three; Four is in no chunk whole.
    assert leaf_chunks(nodes, [(0, 9), (5, 16), (19, 22)]) == [(0, 0), (0, 1), (1, 0), None]
    assert pooling_spans("T", nodes, [(0, 9), (5, 16), (19, 22)]) == [[(2, 6), (7, 11)], [(7, 13)], []]
    assert pooling_spans("", nodes, [(0, 22)]) == [[(0, 4), (5, 9), (10, 16), (17, 22)]]


def test_pooled_span_equals_the_mean_of_the_same_tokens_in_context(embedder: Embedder) -> None:
    text = embedding_text(TITLE, CONTENT)
    nodes = build_tree(CONTENT, TITLE)
    spans = pooling_spans(TITLE, nodes, [(0, len(CONTENT))])[0]
    assert len(spans) == 4
    # Batched with a longer text, so the chunk is padded: padding must not change what is pooled.
    encoded = TokenEncoder(embedder).encode([text, text + " More words." * 20], spans=[spans, []])
    pooled = encoded[0].pooled
    assert pooled is not None and pooled.shape == (4, embedder.dimension)
    hidden, offsets = _hidden(embedder, text)
    for row, (start, end) in enumerate(spans):
        sentence = text[start:end]
        inside = [i for i, (a, b) in enumerate(offsets) if b > a and a >= start and b <= end]
        assert embedder.tokenizer.decode(
            [embedder.tokenizer(text)["input_ids"][i] for i in inside]
        ) == sentence.lower().replace("-", " - "), "the pooled word pieces are exactly the sentence's"
        expected = hidden[inside].mean(axis=0)
        expected /= np.linalg.norm(expected)
        np.testing.assert_allclose(pooled[row], expected, atol=1e-5)
        assert abs(float(np.linalg.norm(pooled[row])) - 1) < 1e-5
    assert encoded[1].pooled is not None and encoded[1].pooled.shape == (0, embedder.dimension)


def test_a_span_past_the_cut_is_nan() -> None:
    states = np.ones((4, 3), dtype=np.float32)
    offsets = np.array([[0, 0], [0, 3], [4, 7], [0, 0]], dtype=np.int64)  # [CLS] abc def [SEP]
    pooled = pool_spans(states, offsets, [(0, 3), (4, 7), (8, 11), (3, 4)], cut=True)
    assert not np.isnan(pooled[:2]).any()
    assert np.isnan(pooled[2]).all(), "past the last kept word piece of a cut text"
    assert np.isnan(pooled[3]).all(), "no word piece inside"
    whole = pool_spans(states, offsets, [(4, 8)], cut=False)
    assert not np.isnan(whole).any(), "in a text that was not cut a span may end past the last word piece"


def _index(service: RagService) -> NodeTreeIndex:
    index = service.pipelines["noderag"].technique_index()
    assert isinstance(index, NodeTreeIndex)
    return index


@pytest.fixture
def pooling_service(tmp_path: Any, embedder: Embedder) -> Iterator[RagService]:
    """A service on a fresh store with every technique and NODERAG_LEAF_VECTORS=pooled."""
    rag = RagService(
        Settings(RAG_DATA_DIR=tmp_path / "data", NODERAG_LEAF_VECTORS="pooled"), embedder=embedder
    )
    yield rag
    rag.close()


def test_ingest_pools_sentence_vectors_from_the_chunk_pass(
    pooling_service: RagService, monkeypatch: Any
) -> None:
    """Every technique, pooled: no sentence is encoded apart, except those no chunk gives whole."""
    service = pooling_service
    encoded_apart: list[str] = []
    encode = service.embedder.encode

    def spy(texts: list[str], **kwargs: Any) -> Any:
        encoded_apart.extend(texts)
        return encode(texts, **kwargs)

    monkeypatch.setattr(service.embedder, "encode", spy)
    # 700 word pieces: the pass cuts the chunk at 512, so its last sentences are embedded apart.
    long_sentences = " ".join(f"Sentence number {i} talks about topic {i}." for i in range(70))
    documents = [SourceDocument("a", CONTENT, TITLE, {}), SourceDocument("long", long_sentences, "", {})]
    service.ingestor.ingest("docs", documents, chunk_size=10_000)
    trees = _index(service).document_trees("docs", ["a", "long"])

    hidden, offsets = _hidden(service.embedder, embedding_text(TITLE, CONTENT))
    spans = pooling_spans(TITLE, build_tree(CONTENT, TITLE), [(0, len(CONTENT))])[0]
    expected = pool_spans(hidden, offsets, spans, cut=False)
    np.testing.assert_allclose(trees["a"].vectors, expected, atol=1e-5)
    a_texts = leaf_texts(TITLE, CONTENT, trees["a"].nodes)
    assert not set(a_texts) & set(encoded_apart), "a's sentences come from its chunk's pass"

    long_texts = leaf_texts("", long_sentences, trees["long"].nodes)
    apart = [t for t in long_texts if t in encoded_apart]
    assert 0 < len(apart) < len(long_texts), "only the sentences past the cut are embedded apart"
    assert long_texts[-1] in apart and long_texts[0] not in apart
    last = trees["long"].vectors[-1]
    np.testing.assert_allclose(last, encode([long_texts[-1]])[0], atol=1e-5)


@pytest.mark.parametrize(
    ("techniques", "leaf_vectors"),
    [("noderag", "pooled"), ("colbert,noderag", "encoded"), ("colbert,noderag", "pooled")],
)
def test_sentences_are_embedded_apart_unless_pooled_from_the_token_pass(
    tmp_path: Any, embedder: Embedder, techniques: str, leaf_vectors: str
) -> None:
    settings = Settings(
        RAG_DATA_DIR=tmp_path / "data", RAG_TECHNIQUES=techniques, NODERAG_LEAF_VECTORS=leaf_vectors
    )
    service = RagService(settings, embedder=embedder)
    try:
        service.ingest(
            {"collection_id": "docs", "documents": [{"id": "a", "title": TITLE, "content": CONTENT}]}
        )
        tree = _index(service).document_trees("docs", ["a"])["a"]
    finally:
        service.close()
    direct = embedder.encode(leaf_texts(TITLE, CONTENT, tree.nodes))
    if techniques == "noderag" or leaf_vectors == "encoded":
        np.testing.assert_allclose(tree.vectors, direct, atol=1e-5)
    else:
        assert not np.allclose(tree.vectors, direct, atol=1e-3), "pooled, not the sentences' own encodes"
