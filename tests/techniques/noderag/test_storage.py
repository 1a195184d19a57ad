"""rag_noderag's storage contract, driven through store.technique_storage on each backend."""

from __future__ import annotations

import numpy as np

from iris_rag.stores.base import DocumentStore
from iris_rag.techniques.noderag.index import build_tree
from iris_rag.techniques.noderag.storage import DocumentTree, NodeTreeStorage

TEXT = "Lava flows downhill. It cools into basalt.\n\nAsh clouds travel far.\nThey ground planes."


def _tree(document_id: str, seed: int) -> DocumentTree:
    nodes = build_tree(TEXT, document_id.title())
    leaves = sum(1 for n in nodes if n.kind == "sentence")
    vectors = np.random.default_rng(seed).standard_normal((leaves, 4)).astype(np.float32)
    return DocumentTree(document_id, nodes, vectors)


def test_trees_round_trip_and_follow_their_documents(any_store: DocumentStore) -> None:
    trees = any_store.technique_storage(NodeTreeStorage)
    assert any_store.technique_storage(NodeTreeStorage) is trees, "one storage per store"
    a, b = _tree("a", 1), _tree("b", 2)
    trees.write_trees("c", [a, b])
    trees.write_trees("other", [_tree("a", 3)])

    got = trees.document_trees("c", ["b", "a", "missing", "a"])
    assert set(got) == {"a", "b"}
    for tree in (a, b):
        assert got[tree.document_id].nodes == tree.nodes, "every field of every node comes back"
        np.testing.assert_array_equal(got[tree.document_id].vectors, tree.vectors)

    leaves = trees.leaves("c")
    sentences = [n for n in a.nodes if n.kind == "sentence"]
    assert leaves.document_ids == ["a"] * len(sentences) + ["b"] * len(sentences), "written order"
    assert list(leaves.node_ids[: len(sentences)]) == [n.node_id for n in sentences]
    assert list(leaves.parent_ids[: len(sentences)]) == [n.parent_id for n in sentences]
    np.testing.assert_array_equal(leaves.matrix, np.vstack([a.vectors, b.vectors]))
    assert trees.indexed_documents("c") == 2
    totals = trees.totals()
    assert (totals.documents, totals.nodes, totals.leaves) == (3, 3 * len(a.nodes), 3 * len(sentences))

    trees.delete_document("c", "a")
    assert set(trees.document_trees("c", ["a", "b"])) == {"b"}
    assert trees.leaves("c").document_ids == ["b"] * len(sentences)
    assert trees.indexed_documents("c") == 1
    assert set(trees.document_trees("other", ["a"])) == {"a"}, "another collection's tree stays"
    empty = trees.leaves("nothing")
    assert empty.matrix.shape == (0, 0) and empty.document_ids == []
