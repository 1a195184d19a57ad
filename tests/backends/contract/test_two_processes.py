"""Two processes on one store: what another process writes is seen on this process's next call.

The writer is a second store in a subprocess (`python -c`), configured only by the RAG_* environment,
as `iris-rag ingest` would be next to a running server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

from iris_rag.stores.base import DocumentStore, KeywordQuery
from tests.backends.contract.conftest import IRIS_DOUBLE, Backend
from tests.backends.contract.corpus import DIM, document, new_collection, unit_vector
from tests.conftest import ROOT

WRITER = """
import sys
import numpy as np
import pytest
from iris_rag.backends import create_store
from iris_rag.settings import Settings
from iris_rag.stores.base import ChunkInput, DocumentInput

store = create_store(Settings())
action, dimension = sys.argv[1], int(sys.argv[2])
if action == "write":
    vector = np.zeros(dimension, np.float32)
    vector[0] = 1.0
    text = "penguins incubate eggs"
    chunk = ChunkInput(0, text, 0, len(text), vector)
    store.upsert_documents("c", [DocumentInput("penguin", "Emperor", text, {"year": 2023}, [chunk])])
else:
    assert store.delete_document("c", "penguin")
store.close()
"""


def run_writer(backend: Backend, action: str) -> None:
    env = {**os.environ, **backend.env, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-c", WRITER, action, str(DIM)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )


def test_another_processs_write_and_delete_are_seen_on_the_next_call(
    store: DocumentStore, backend: Backend
) -> None:
    if backend.name == IRIS_DOUBLE:
        pytest.skip("the IRIS test double answers in this process only: the writer subprocess has no server")
    new_collection(store)
    store.upsert_documents("c", [document(f"d{i}", [f"filler text {i}"]) for i in range(20)])
    axis = np.zeros(DIM, np.float32)
    axis[0] = 1.0
    # Warm whatever this store caches: the version, the dense matrix, the keyword statistics.
    before = store.data_version("c")
    assert "penguin#0" not in {h.chunk_id for h in store.vector_search("c", axis, 3)}
    assert store.keyword_search("c", KeywordQuery.of(["penguins"]), 3) == []
    assert store.chunk_count("c") == 20

    run_writer(backend, "write")
    written = store.data_version("c")
    assert written != before
    assert store.vector_search("c", axis, 1)[0].chunk_id == "penguin#0"
    assert [h.chunk_id for h in store.keyword_search("c", KeywordQuery.of(["penguins"]), 3)] == ["penguin#0"]
    assert store.chunk_count("c") == 21
    assert "penguin" in store.document_ids("c")
    info = store.get_collection("c")
    assert info is not None and info.document_count == 21

    run_writer(backend, "delete")
    assert store.data_version("c") not in (before, written)
    assert "penguin#0" not in {h.chunk_id for h in store.vector_search("c", axis, 3)}
    assert store.keyword_search("c", KeywordQuery.of(["penguins"]), 3) == []
    assert store.chunk_count("c") == 20


def test_a_second_store_in_this_process_sees_writes_too(
    store: DocumentStore, make_store: Callable[[], DocumentStore]
) -> None:
    new_collection(store)
    store.upsert_documents("c", [document("a", ["alpha"], vectors=[unit_vector(1)])])
    reader = make_store()
    assert reader.vector_search("c", unit_vector(1), 5)[0].chunk_id == "a#0"
    store.upsert_documents("c", [document("b", ["beta"], vectors=[unit_vector(2)])])
    assert reader.vector_search("c", unit_vector(2), 1)[0].chunk_id == "b#0"
    assert reader.data_version("c") == store.data_version("c")
