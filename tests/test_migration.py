"""`iris-rag migrate`: every technique ranks the same after a copy, vectors verbatim, nothing re-embedded.

Real stores on both sides: a SQLite store built by the real service (all eight techniques, the real model),
copied by the real command to PostgreSQL (pgserver) and to another SQLite file.
"""

from __future__ import annotations

import itertools
import secrets
import socket
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from iris_rag import migration
from iris_rag.backends import create_store
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.cli import main
from iris_rag.embedder import Embedder
from iris_rag.errors import CollectionNotFoundError, InvalidParametersError
from iris_rag.migration import StoreSpec, migrate
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import ChunkInput, DocumentInput
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from iris_rag.techniques.graphrag.storage import KnowledgeGraphStorage
from iris_rag.techniques.noderag.storage import NodeTreeStorage
from iris_rag.techniques.sqlrag.storage import StructuredTableStorage
from iris_rag.techniques.sqlrag.tables import ingest_table, parse_records
from tests.conftest import DOCUMENTS, SAMPLE_CORPUS

QUERIES = [
    "what makes sourdough rise",
    "aspirin and the risk of bleeding",
    "reference curves for children's height and weight",
]
TECHNIQUES = ["basic", "hyde", "hybrid_ifind", "crag", "colbert", "noderag", "graphrag", "sqlrag"]


def _corpus() -> list[dict[str, Any]]:
    scifact = [orjson.loads(line) for line in SAMPLE_CORPUS.read_text(encoding="utf-8").splitlines()[:12]]
    return DOCUMENTS + [
        {"id": d["_id"], "title": d["title"], "content": d["text"], "metadata": {"source": "scifact"}}
        for d in scifact
    ]


def _arguments(technique: str, query: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {"query": query, "collection_id": "docs", "options": {"top_k": 5}}
    if technique == "sqlrag":
        arguments["technique_params"] = {
            "sql": "SELECT id, title, year FROM documents_docs ORDER BY id",
            "combine_with_vector": True,
        }
    return arguments


def rankings(service: RagService) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """Every technique's ranked (id, score) for every query."""
    found = {}
    for technique, query in itertools.product(TECHNIQUES, QUERIES):
        result = service.execute({"technique": technique, "arguments": _arguments(technique, query)})
        assert result["success"], result
        documents = result["retrieved_documents"]
        found[technique, query] = [(d["chunk_id"], float(d["similarity_score"])) for d in documents]
        if technique == "sqlrag":
            rows = result["metadata"]["technique_specific"]["rows"]
            found[technique, query + " rows"] = [(orjson.dumps(r).decode(), 0.0) for r in rows]
    return found


def assert_same_rankings(
    before: dict[tuple[str, str], list[tuple[str, float]]],
    after: dict[tuple[str, str], list[tuple[str, float]]],
) -> None:
    assert before.keys() == after.keys()
    for key, ranked in before.items():
        assert [i for i, _ in after[key]] == [i for i, _ in ranked], key
        assert [s for _, s in after[key]] == pytest.approx([s for _, s in ranked], abs=1e-5), key


@dataclass(frozen=True)
class Source:
    """The SQLite store the tests copy from, and what each technique answered on it."""

    path: Path
    rankings: dict[tuple[str, str], list[tuple[str, float]]]
    graph_counts: dict[str, int]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Source:
    data = tmp_path_factory.mktemp("source")
    service = RagService(Settings(RAG_DATA_DIR=data), embedder=embedder)
    try:
        result = service.ingest({"collection_id": "docs", "documents": _corpus()})
        assert result["ingested_count"] == len(_corpus())
        service.ingest({"collection_id": "other", "documents": DOCUMENTS[:1]})
        service.store.set_description("docs", "three subjects and some SciFact abstracts")
        assert service.stale_indexes("docs") == []
        graph = service.store.technique_storage(KnowledgeGraphStorage).counts("docs")
        assert graph["entities"] > 0 and graph["relations"] > 0, graph
        ranked = rankings(service)
        for technique in TECHNIQUES:  # each technique found something to compare
            assert any(ranked[technique, query] for query in QUERIES), technique
        return Source(service.settings.database_path, ranked, graph)
    finally:
        service.close()


def _service(settings: Settings, embedder: Embedder) -> RagService:
    return RagService(settings, embedder=embedder)


def _migrate(*arguments: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["migrate", *arguments])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_copied(source: Source, target: Any, settings: Settings, embedder: Embedder) -> None:
    origin = SqliteStore(source.path)
    try:
        for collection in ("docs", "other"):
            before, after = origin.get_collection(collection), target.get_collection(collection)
            assert before is not None and after is not None
            assert (after.embedding_model, after.dimension, after.description) == (
                before.embedding_model,
                before.dimension,
                before.description,
            )
            assert (after.document_count, after.chunk_count) == (before.document_count, before.chunk_count)
            assert target.document_ids(collection) == origin.document_ids(collection)
            chunks = [
                c.chunk_id
                for d in origin.document_ids(collection)
                for c in origin.get_document_chunks(collection, d)
            ]
            old, new = origin.chunk_vectors(collection, chunks), target.chunk_vectors(collection, chunks)
            assert old.keys() == new.keys() == set(chunks)
            for chunk in chunks:  # bit for bit: copied, not encoded again
                assert old[chunk].tobytes() == new[chunk].tobytes(), chunk
            for document in origin.document_ids(collection):
                copied, original = (
                    target.get_document(collection, document),
                    origin.get_document(collection, document),
                )
                assert copied is not None and original is not None
                assert (copied.title, copied.content, copied.metadata) == (
                    original.title,
                    original.content,
                    original.metadata,
                )
        _assert_same_technique_rows(origin, target)
    finally:
        origin.close()
    service = _service(settings, embedder)
    try:
        assert service.stale_indexes("docs") == []
        assert service.store.technique_storage(KnowledgeGraphStorage).counts("docs") == source.graph_counts
        assert_same_rankings(source.rankings, rankings(service))
    finally:
        service.close()


def _assert_same_technique_rows(origin: Any, target: Any) -> None:
    """The technique rows themselves, beyond the rankings: graph aliases and documents, token frequencies,
    node trees (entity ids differ between stores: aliases compare by entity key)."""
    old_graph = origin.technique_storage(KnowledgeGraphStorage)
    new_graph = target.technique_storage(KnowledgeGraphStorage)

    def aliases(graph: Any) -> list[tuple[str, str, str, str]]:
        keys = {e.row.id: e.row.key for e in graph.entities("docs", 0)}
        return sorted(
            (a.alias, keys[a.entity_id], a.document_id, a.surface) for a in graph.alias_rows("docs")
        )

    assert aliases(new_graph) == aliases(old_graph)
    assert new_graph.graph_documents("docs") == old_graph.graph_documents("docs")
    assert len(new_graph.graph_documents("docs")) == len(_corpus())
    old_record, new_record = old_graph.graph_record("docs"), new_graph.graph_record("docs")
    assert old_record is not None and new_record is not None
    assert (new_record.extractor, new_record.llm_model) == (old_record.extractor, old_record.llm_model)
    old_tokens = origin.technique_storage(TokenVectorStorage)
    new_tokens = target.technique_storage(TokenVectorStorage)
    assert new_tokens.frequencies("docs") == old_tokens.frequencies("docs")
    old_trees = origin.technique_storage(NodeTreeStorage).leaves("docs")
    new_trees = target.technique_storage(NodeTreeStorage).leaves("docs")
    assert new_trees.document_ids == old_trees.document_ids
    assert new_trees.matrix.tobytes() == old_trees.matrix.tobytes()


def test_sqlite_to_postgres_ranks_the_same_for_every_technique(
    source: Source,
    postgres_url: str,
    tmp_path: Path,
    embedder: Embedder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _migrate(
        "--from", f"sqlite:{source.path}", "--to", f"postgres:{postgres_url}", capsys=capsys
    )
    assert code == 0, err
    summary = [orjson.loads(line) for line in out.splitlines()]
    assert [s["collection"] for s in summary] == ["docs", "other"]
    assert summary[0]["documents"] == len(_corpus())
    assert summary[0]["techniques"]["colbert"] == summary[0]["techniques"]["noderag"] == len(_corpus())
    settings = Settings(RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url, RAG_DATA_DIR=tmp_path)
    from iris_rag.backends import create_store

    target = create_store(settings)
    try:
        _assert_copied(source, target, settings, embedder)
    finally:
        target.close()


def test_sqlite_to_sqlite_copies_without_the_model_and_refuses_to_overwrite(
    source: Source,
    tmp_path: Path,
    embedder: Embedder,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target_dir = tmp_path / "target"
    target_dir.mkdir()
    with monkeypatch.context() as patch:
        # No model at all: the command never makes an Embedder, nor encodes with one.
        for name in ("__init__", "encode", "encode_query", "map_bulk", "run_with_model", "load"):
            patch.setattr(Embedder, name, _refuse)
        code, out, err = _migrate(
            "--from", f"sqlite:{source.path}", "--to", f"sqlite:{target_dir}", capsys=capsys
        )
        assert code == 0, err
        # Again: both collections are there already, so nothing is written and the run says why.
        code, out, err = _migrate(
            "--from", f"sqlite:{source.path}", "--to", f"sqlite:{target_dir}", capsys=capsys
        )
        assert code == 2 and out == ""
        assert "INVALID_PARAMETERS" in err and "already holds 'docs', 'other'" in err and "--replace" in err
        # --replace: each collection is deleted and copied again, in one transaction.
        code, out, err = _migrate(
            "--from",
            f"sqlite:{source.path}",
            "--to",
            f"sqlite:{target_dir}",
            "--collection",
            "docs",
            "--replace",
            capsys=capsys,
        )
        assert code == 0, err
        assert orjson.loads(out)["replaced"] is True
    settings = Settings(RAG_DATA_DIR=target_dir)
    target = SqliteStore(settings.database_path)
    try:
        _assert_copied(source, target, settings, embedder)
    finally:
        target.close()


def _refuse(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("migrate called the embedding model")


def test_a_failed_copy_leaves_the_target_without_the_collection(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin, target = SqliteStore(source.path), SqliteStore(tmp_path / "target.sqlite3")
    calls = itertools.count()
    upsert = target.upsert_documents

    def failing(*args: Any, **kwargs: Any) -> int:
        if next(calls) == 2:
            raise RuntimeError("disk full")
        return upsert(*args, **kwargs)

    monkeypatch.setattr(migration, "BATCH", 4)
    monkeypatch.setattr(target, "upsert_documents", failing)
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            migrate(origin, target, ["other", "docs"])
        # 'other' went whole before 'docs' failed on its third batch: 'docs' left nothing behind.
        assert [c.id for c in target.list_collections()] == ["other"]
        assert target.document_ids("docs") == []
        assert target.technique_storage(KnowledgeGraphStorage).graph_record("docs") is None
    finally:
        origin.close()
        target.close()


def test_bad_stores_and_collections_are_refused_clearly(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidParametersError, match="use sqlite:PATH"):
        StoreSpec.parse("mysql://root:hunter22@db/x")
    try:
        StoreSpec.parse("mysql://root:hunter22@db/x")
    except InvalidParametersError as exc:
        assert "hunter22" not in exc.message
    assert StoreSpec.parse("postgresql://u:p@h/db") == StoreSpec("postgres", "postgresql://u:p@h/db")
    assert StoreSpec.parse(f"sqlite:{tmp_path}") == StoreSpec("sqlite", str(tmp_path / "iris_rag.sqlite3"))
    assert StoreSpec.parse("iris:") == StoreSpec("iris", "")
    code, _, err = _migrate(
        "--from", f"sqlite:{tmp_path / 'none.sqlite3'}", "--to", f"sqlite:{tmp_path}", capsys=capsys
    )
    assert code == 2 and "no SQLite store at" in err
    assert not (tmp_path / "none.sqlite3").exists()
    code, _, err = _migrate("--from", f"sqlite:{source.path}", "--to", f"sqlite:{source.path}", capsys=capsys)
    assert code == 2 and "the same store" in err
    code, _, err = _migrate("--from", f"sqlite:{source.path}", "--to", "iris:", capsys=capsys)
    assert code == 2 and "IRIS_HOST is not set" in err
    with pytest.MonkeyPatch.context() as patch:  # an IRIS server that is not there: refused by name, at once
        patch.setenv("IRIS_HOST", "127.0.0.1")
        patch.setenv("IRIS_PORT", str(_closed_port()))
        patch.setenv("IRIS_PASSWORD", "Sup3rSecret!")
        code, _, err = _migrate("--from", f"sqlite:{source.path}", "--to", "iris:", capsys=capsys)
    assert code == 2 and "cannot reach IRIS at 127.0.0.1" in err and "Sup3rSecret!" not in err
    origin, target = SqliteStore(source.path), SqliteStore(tmp_path / "t.sqlite3")
    try:
        with pytest.raises(CollectionNotFoundError, match="'nope'"):
            migrate(origin, target, ["docs", "nope"])
        assert target.list_collections() == []
    finally:
        origin.close()
        target.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_vectors_read_back_verbatim(source: Source) -> None:
    store = SqliteStore(source.path)
    try:
        chunks = [c.chunk_id for c in store.get_document_chunks("docs", "aspirin")]
        vectors = store.chunk_vectors("docs", [*chunks, "missing#0"])
        assert list(vectors) == chunks
        assert all(v.dtype == np.float32 and v.shape == (384,) for v in vectors.values())
    finally:
        store.close()


def test_rows_the_target_cannot_hold_are_refused_or_left_behind_when_told(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for IRIS, which has no GraphRAG storage yet: refused by name, or skipped with --skip-technique."""
    from iris_rag.backends import sqlite

    lacking = {k: v for k, v in sqlite.TECHNIQUE_STORAGE.items() if k is not KnowledgeGraphStorage}
    origin = SqliteStore(source.path)
    try:
        origin.technique_storage(KnowledgeGraphStorage)  # the source has one (made once per store)
        with monkeypatch.context() as patch:
            patch.setattr(sqlite, "TECHNIQUE_STORAGE", lacking)
            target = SqliteStore(tmp_path / "t.sqlite3")
            try:
                with pytest.raises(
                    InvalidParametersError, match=r"'docs' has graphrag rows .*--skip-technique"
                ):
                    migrate(origin, target, ["docs"])
                assert target.list_collections() == []
                with pytest.raises(InvalidParametersError, match="unknown techniques to skip"):
                    migrate(origin, target, ["docs"], skip=frozenset({"graph"}))
                copies = migrate(origin, target, ["docs"], skip=frozenset({"graphrag"}))
                assert "graphrag" not in copies[0].techniques and copies[0].techniques["colbert"] == len(
                    _corpus()
                )
            finally:
                target.close()
        target = SqliteStore(tmp_path / "t.sqlite3")
        try:
            assert target.technique_storage(KnowledgeGraphStorage).graph_record("docs") is None
            assert target.get_collection("docs") is not None
        finally:
            target.close()
    finally:
        origin.close()


def test_a_document_rewritten_while_it_is_copied_arrives_whole_old_or_whole_new(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process rewrites a document between migrate's read of it and of its chunks.

    The document and its chunks come from one read snapshot, so the copy is the document as it was,
    never its old text with the new chunks.
    """
    path = tmp_path / "source.sqlite3"
    with sqlite3.connect(source.path) as original, sqlite3.connect(path) as copy:
        original.backup(copy)
    origin, writer, target = SqliteStore(path), SqliteStore(path), SqliteStore(tmp_path / "target.sqlite3")
    old = origin.get_document("docs", "aspirin")
    assert old is not None
    new_text = "Rewritten meanwhile. " * 3
    rewrite = DocumentInput(
        "aspirin",
        "new title",
        new_text,
        {},
        [ChunkInput(0, new_text, 0, len(new_text), np.ones(384, np.float32))],
    )
    get_document = origin.get_document

    def rewritten_after_the_read(collection_id: str, document_id: str) -> Any:
        document = get_document(collection_id, document_id)
        if document_id == "aspirin":
            writer.upsert_documents("docs", [rewrite])  # another connection: commits now
        return document

    monkeypatch.setattr(origin, "get_document", rewritten_after_the_read)
    try:
        migrate(origin, target, ["docs"])
        copied = target.get_document("docs", "aspirin")
        assert copied is not None and copied.content == old.content
        chunks = target.get_document_chunks("docs", "aspirin")
        assert chunks and all(c.content in old.content for c in chunks)
        landed = get_document("docs", "aspirin")  # the rewrite did land in the source
        assert landed is not None and landed.content == new_text
    finally:
        for store in (origin, writer, target):
            store.close()


def _private_copy(source: Source, data: Path) -> Path:
    """The source store copied into the folder `data` (tests that write to their source)."""
    data.mkdir()
    path = data / "iris_rag.sqlite3"
    with sqlite3.connect(source.path) as original, sqlite3.connect(path) as copy:
        original.backup(copy)
    return path


def _add_people_table(path: Path, collection_id: str) -> None:
    """A structured table of the collection, as rag_ingest_table makes one (migrate never copies them)."""
    store = SqliteStore(path)
    try:
        storage = store.technique_storage(StructuredTableStorage)
        ingest_table(
            storage,
            "people",
            parse_records([{"name": "Ada"}]),
            collection_id=collection_id,
            source="people.csv",
        )
    finally:
        store.close()


def test_a_sqlite_target_that_does_not_exist_yet_is_a_data_folder(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's `--to sqlite:/backup`: a folder holding iris_rag.sqlite3, ready to be a RAG_DATA_DIR."""
    backup = tmp_path / "backup"
    for spelled in (str(backup), f"{backup}/"):
        assert StoreSpec.parse(f"sqlite:{spelled}") == StoreSpec("sqlite", str(backup / "iris_rag.sqlite3"))
    # A name ending in .sqlite3 or .db, or a file already there, is the file itself.
    for name in ("copy.sqlite3", "copy.db"):
        assert StoreSpec.parse(f"sqlite:{tmp_path / name}") == StoreSpec("sqlite", str(tmp_path / name))
    existing = tmp_path / "store-file"
    existing.touch()
    assert StoreSpec.parse(f"sqlite:{existing}") == StoreSpec("sqlite", str(existing))
    code, _, err = _migrate(
        "--from", f"sqlite:{source.path}", "--to", f"sqlite:{backup}/", "--collection", "other", capsys=capsys
    )
    assert code == 0, err
    assert backup.is_dir()
    target = create_store(Settings(RAG_DATA_DIR=backup))
    try:
        assert [c.id for c in target.list_collections()] == ["other"]
    finally:
        target.close()


def test_the_same_store_spelled_otherwise_is_refused_before_anything_is_written(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relative path, the folder or the file, a symlinked folder: one store, so --replace would copy a
    collection onto itself (and drop its structured tables, which migrate does not copy)."""
    data = tmp_path / "data"
    path = _private_copy(source, data)
    _add_people_table(path, "docs")
    (tmp_path / "link").symlink_to(data)
    monkeypatch.chdir(tmp_path)
    for spelled in (
        "data",
        "data/iris_rag.sqlite3",
        "./data/",
        str(tmp_path / "link"),
        "link/iris_rag.sqlite3",
    ):
        code, out, err = _migrate(
            "--from",
            f"sqlite:{path}",
            "--to",
            f"sqlite:{spelled}",
            "--collection",
            "docs",
            "--replace",
            capsys=capsys,
        )
        assert code == 2 and "the same store" in err and out == "", (spelled, err)
    store = SqliteStore(path)
    try:
        assert store.technique_storage(StructuredTableStorage).get_table("t_people") is not None
        info = store.get_collection("docs")
        assert info is not None and info.document_count == len(_corpus())
    finally:
        store.close()
    # PostgreSQL: the same server and database, whoever logs in and however the port is spelled.
    same = StoreSpec.parse("postgres:postgresql://alice:pw@db.example:5432/rag")
    assert same.same_store(StoreSpec.parse("postgresql://bob:other@db.example/rag"))
    assert not same.same_store(StoreSpec.parse("postgresql://alice:pw@db.example:5432/other"))
    assert not same.same_store(StoreSpec.parse("postgresql://alice:pw@db2.example:5432/rag"))
    assert not same.same_store(StoreSpec.parse(f"sqlite:{path}"))


@contextmanager
def _tcp_port_of(socket_path: str) -> Iterator[int]:
    """A TCP port on 127.0.0.1 that carries each connection to a Unix socket (the pgserver fixture listens
    on its socket alone): the one server reached by TCP too, as localhost or as 127.0.0.1."""
    listener = socket.create_server(("127.0.0.1", 0))

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            sink.close()

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            server = socket.socket(socket.AF_UNIX)
            server.connect(socket_path)
            for ends in ((client, server), (server, client)):
                threading.Thread(target=pipe, args=ends, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


@contextmanager
def _databases_of_a_plain_role(admin_url: str, *names: str) -> Iterator[str]:
    """Databases owned by a new role without superuser (the vector extension made for it): the role."""
    import psycopg

    role = f"migrator_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
        for name in names:
            admin.execute(f"CREATE DATABASE {name} OWNER {role}")
            with psycopg.connect(admin_url.replace("/postgres?", f"/{name}?", 1), autocommit=True) as db:
                db.execute("CREATE EXTENSION vector")
    try:
        yield role
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"DROP ROLE {role}")


def test_one_postgres_database_through_another_address_is_refused_and_two_databases_are_not(
    source: Source,
    postgres_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """localhost, 127.0.0.1 and the server's socket (through a symlinked folder too) name one server, which
    the URLs alone cannot tell: --replace then deleted the collection it was copying, or waited for ever on
    its own lock (a lock timeout here makes that a failure)."""
    from psycopg.conninfo import conninfo_to_dict

    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=10s")

    server = conninfo_to_dict(postgres_server)
    folder, port = str(server["host"]), str(server.get("port") or 5432)
    (tmp_path / "link").symlink_to(folder)
    one, two = f"one_{secrets.token_hex(4)}", f"two_{secrets.token_hex(4)}"
    with (
        _databases_of_a_plain_role(postgres_server, one, two) as role,
        _tcp_port_of(f"{folder}/.s.PGSQL.{port}") as tcp,
    ):

        def spellings(database: str) -> list[str]:
            return [
                f"postgresql://{role}@/{database}?host={folder}&port={port}",
                f"postgresql://{role}@localhost:{tcp}/{database}",
                f"postgresql://{role}@127.0.0.1:{tcp}/{database}",
                f"postgresql://{role}@/{database}?host={tmp_path / 'link'}&port={port}",
            ]

        code, _, err = _migrate(
            "--from",
            f"sqlite:{source.path}",
            "--to",
            spellings(one)[0],
            "--collection",
            "other",
            capsys=capsys,
        )
        assert code == 0, err
        for source_url, target_url in itertools.permutations(spellings(one), 2):
            code, out, err = _migrate(
                "--from", source_url, "--to", target_url, "--collection", "other", "--replace", capsys=capsys
            )
            assert code == 2 and "the same store" in err and out == "", (source_url, target_url, err)
        settings = Settings(RAG_STORE="postgres", RAG_POSTGRES_URL=spellings(one)[0], RAG_DATA_DIR=tmp_path)
        store = create_store(settings)
        try:
            info = store.get_collection("other")
            assert info is not None and info.document_count == 1
        finally:
            store.close()
        # Two databases of one server are two stores, however each is reached.
        code, out, err = _migrate(
            "--from", spellings(one)[1], "--to", spellings(two)[2], "--collection", "other", capsys=capsys
        )
        assert code == 0 and orjson.loads(out)["documents"] == 1, err


def test_replace_names_the_structured_tables_it_drops_from_the_target_collection(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "target"
    code, _, err = _migrate(
        "--from", f"sqlite:{source.path}", "--to", f"sqlite:{target}", "--collection", "other", capsys=capsys
    )
    assert code == 0, err
    _add_people_table(target / "iris_rag.sqlite3", "other")
    code, out, err = _migrate(
        "--from",
        f"sqlite:{source.path}",
        "--to",
        f"sqlite:{target}",
        "--collection",
        "other",
        "--replace",
        capsys=capsys,
    )
    assert code == 0, err
    summary = orjson.loads(out)
    assert summary["replaced"] is True and summary["dropped_tables"] == ["t_people"]
    # Said on stderr too (the command logs warnings there; here pytest captures them).
    assert "t_people" in caplog.text and "does not copy structured tables" in caplog.text
