"""KnowledgeGraphStorage on SQLite: the kg_* tables in the store's file (SQL moved from the graph index)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.techniques.graphrag.storage import (
    AliasRow,
    EntityKey,
    EntityRow,
    EvidenceRow,
    GraphDocument,
    GraphRecord,
    GraphWrite,
    MentionRow,
    RelationRow,
    StoredEntity,
)

_BATCH = 500  # ids per IN (...) list
# Every table holding a collection's graph rows, dependents first.
_GRAPH_TABLES = (
    "kg_evidence",
    "kg_mentions",
    "kg_aliases",
    "kg_relations",
    "kg_entities",
    "kg_documents",
    "kg_collections",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kg_collections (
    collection_id TEXT PRIMARY KEY,
    extractor     TEXT NOT NULL,
    llm_model     TEXT,
    version       INTEGER NOT NULL DEFAULT 0,
    updated_at    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kg_documents (
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    extractor     TEXT NOT NULL,
    entities      INTEGER NOT NULL,
    relations     INTEGER NOT NULL,
    note          TEXT,
    PRIMARY KEY (collection_id, document_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kg_entities (
    id             INTEGER PRIMARY KEY,
    collection_id  TEXT NOT NULL,
    key            TEXT NOT NULL,
    name           TEXT NOT NULL,
    type           TEXT NOT NULL,
    mention_count  INTEGER NOT NULL DEFAULT 0,
    document_count INTEGER NOT NULL DEFAULT 0,
    embedding      BLOB,
    UNIQUE (collection_id, key)
);
CREATE TABLE IF NOT EXISTS kg_aliases (
    collection_id TEXT NOT NULL,
    alias         TEXT NOT NULL,
    entity_id     INTEGER NOT NULL,
    document_id   TEXT NOT NULL,
    surface       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS kg_aliases_by_alias ON kg_aliases(collection_id, alias);
CREATE INDEX IF NOT EXISTS kg_aliases_by_document ON kg_aliases(collection_id, document_id);
CREATE TABLE IF NOT EXISTS kg_mentions (
    collection_id TEXT NOT NULL,
    entity_id     INTEGER NOT NULL,
    document_id   TEXT NOT NULL,
    chunk_id      TEXT NOT NULL,
    field         TEXT NOT NULL,
    start_char    INTEGER NOT NULL,
    end_char      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS kg_mentions_by_entity ON kg_mentions(entity_id);
CREATE INDEX IF NOT EXISTS kg_mentions_by_document ON kg_mentions(collection_id, document_id);
CREATE TABLE IF NOT EXISTS kg_relations (
    id            INTEGER PRIMARY KEY,
    collection_id TEXT NOT NULL,
    source_id     INTEGER NOT NULL,
    target_id     INTEGER NOT NULL,
    type          TEXT NOT NULL,
    weight        INTEGER NOT NULL,
    UNIQUE (collection_id, source_id, target_id, type)
);
CREATE INDEX IF NOT EXISTS kg_relations_by_target ON kg_relations(collection_id, target_id);
CREATE TABLE IF NOT EXISTS kg_evidence (
    relation_id   INTEGER NOT NULL,
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    chunk_id      TEXT NOT NULL,
    count         INTEGER NOT NULL,
    field         TEXT NOT NULL,
    start_char    INTEGER NOT NULL,
    end_char      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS kg_evidence_by_relation ON kg_evidence(relation_id);
CREATE INDEX IF NOT EXISTS kg_evidence_by_document ON kg_evidence(collection_id, document_id);
"""


def _batches(items: Sequence[Any], size: int = _BATCH) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _marks(items: Sequence[Any]) -> str:
    return ",".join("?" * len(items))


def _blob(vector: npt.NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


class SqliteKnowledgeGraph:
    """The graph's rows in the store's SQLite file; the tables are made with the storage."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        with store.write_transaction() as connection:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    connection.execute(statement)
            columns = {row[1] for row in connection.execute("PRAGMA table_info(kg_entities)").fetchall()}
            if "embedding" not in columns:  # a graph from before name vectors were stored
                connection.execute("ALTER TABLE kg_entities ADD COLUMN embedding BLOB")

    # Write side
    def alias_votes(self, collection_id: str, aliases: list[str]) -> list[tuple[str, str, int]]:
        """(alias, entity key, count) for the given aliases."""
        connection = self._store.connection()
        votes: list[tuple[str, str, int]] = []
        for batch in _batches(sorted(aliases)):
            votes += [
                (row[0], row[1], int(row[2]))
                for row in connection.execute(
                    f"""SELECT a.alias, e.key, COUNT(*) FROM kg_aliases a
                        JOIN kg_entities e ON e.id = a.entity_id
                        WHERE a.collection_id = ? AND a.alias IN ({_marks(batch)})
                        GROUP BY a.alias, e.key""",
                    (collection_id, *batch),
                ).fetchall()
            ]
        return votes

    def ensure_entities(self, collection_id: str, entities: dict[str, tuple[str, str]]) -> list[EntityKey]:
        """Create the absent entities; every asked one with its id and whether it lacks a vector."""
        connection = self._store.connection()
        connection.executemany(
            "INSERT OR IGNORE INTO kg_entities (collection_id, key, name, type) VALUES (?, ?, ?, ?)",
            [(collection_id, key, name, kind) for key, (name, kind) in entities.items()],
        )
        found: list[EntityKey] = []
        for batch in _batches(list(entities)):
            rows = connection.execute(
                "SELECT id, key, name, embedding IS NULL FROM kg_entities "
                f"WHERE collection_id = ? AND key IN ({_marks(batch)})",
                (collection_id, *batch),
            ).fetchall()
            found += [EntityKey(int(row[0]), row[1], row[2], bool(row[3])) for row in rows]
        return found

    def set_entity_vectors(self, vectors: list[tuple[int, npt.NDArray[np.float32]]]) -> None:
        """Store entities' name vectors."""
        self._store.connection().executemany(
            "UPDATE kg_entities SET embedding = ? WHERE id = ?", [(_blob(v), i) for i, v in vectors]
        )

    def add(self, collection_id: str, write: GraphWrite) -> None:
        """Add mentions, counts, relation weights with their evidence, aliases and documents."""
        connection = self._store.connection()
        connection.executemany(
            "INSERT INTO kg_mentions VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (collection_id, m.entity_id, m.document_id, m.chunk_id, m.field, m.start_char, m.end_char)
                for m in write.mentions
            ],
        )
        connection.executemany(
            "UPDATE kg_entities SET mention_count = mention_count + ?, document_count = document_count + ? "
            "WHERE id = ?",
            [(mentions, documents, e) for e, (mentions, documents) in write.counts.items()],
        )
        evidence_rows: list[tuple[Any, ...]] = []
        for relation in write.relations:
            relation_id = connection.execute(
                """INSERT INTO kg_relations (collection_id, source_id, target_id, type, weight)
                   VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT (collection_id, source_id, target_id, type)
                   DO UPDATE SET weight = weight + excluded.weight
                   RETURNING id""",
                (collection_id, relation.source_id, relation.target_id, relation.type, relation.weight),
            ).fetchone()[0]
            evidence_rows += [
                (
                    relation_id,
                    collection_id,
                    e.document_id,
                    e.chunk_id,
                    e.count,
                    e.field,
                    e.start_char,
                    e.end_char,
                )
                for e in relation.evidence
            ]
        connection.executemany("INSERT INTO kg_evidence VALUES (?, ?, ?, ?, ?, ?, ?, ?)", evidence_rows)
        connection.executemany(
            "INSERT INTO kg_aliases VALUES (?, ?, ?, ?, ?)",
            [(collection_id, a.alias, a.entity_id, a.document_id, a.surface) for a in write.aliases],
        )
        connection.executemany(
            "INSERT INTO kg_documents VALUES (?, ?, ?, ?, ?, ?)",
            [
                (collection_id, d.document_id, d.extractor, d.entities, d.relations, d.note)
                for d in write.documents
            ],
        )

    def delete_document(self, collection_id: str, document_id: str) -> bool:
        """Take a document out of the graph, counts and weights with it; False if it was not covered."""
        connection = self._store.connection()
        known = connection.execute(
            "SELECT 1 FROM kg_documents WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        ).fetchone()
        if known is None:
            return False
        counts = connection.execute(
            "SELECT relation_id, SUM(count) FROM kg_evidence WHERE collection_id = ? AND document_id = ? "
            "GROUP BY relation_id",
            (collection_id, document_id),
        ).fetchall()
        connection.executemany(
            "UPDATE kg_relations SET weight = weight - ? WHERE id = ?", [(c[1], c[0]) for c in counts]
        )
        connection.execute(
            "DELETE FROM kg_evidence WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        )
        for batch in _batches([c[0] for c in counts]):
            connection.execute(
                f"DELETE FROM kg_relations WHERE weight <= 0 AND id IN ({_marks(batch)})", tuple(batch)
            )
        mentioned = connection.execute(
            "SELECT entity_id, COUNT(*) FROM kg_mentions WHERE collection_id = ? AND document_id = ? "
            "GROUP BY entity_id",
            (collection_id, document_id),
        ).fetchall()
        connection.executemany(
            "UPDATE kg_entities SET mention_count = mention_count - ?, document_count = document_count - 1 "
            "WHERE id = ?",
            [(m[1], m[0]) for m in mentioned],
        )
        connection.execute(
            "DELETE FROM kg_mentions WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        )
        for batch in _batches([m[0] for m in mentioned]):
            gone = [
                row[0]
                for row in connection.execute(
                    f"SELECT id FROM kg_entities WHERE mention_count <= 0 AND id IN ({_marks(batch)})",
                    tuple(batch),
                ).fetchall()
            ]
            if gone:
                marks = _marks(gone)
                # Their relations lost all evidence with the mentions; this only guards against drift.
                connection.execute(
                    f"DELETE FROM kg_evidence WHERE relation_id IN (SELECT id FROM kg_relations "
                    f"WHERE source_id IN ({marks}) OR target_id IN ({marks}))",
                    (*gone, *gone),
                )
                connection.execute(
                    f"DELETE FROM kg_relations WHERE source_id IN ({marks}) OR target_id IN ({marks})",
                    (*gone, *gone),
                )
                connection.execute(f"DELETE FROM kg_aliases WHERE entity_id IN ({marks})", tuple(gone))
                connection.execute(f"DELETE FROM kg_entities WHERE id IN ({marks})", tuple(gone))
        connection.execute(
            "DELETE FROM kg_aliases WHERE collection_id = ? AND document_id = ?", (collection_id, document_id)
        )
        connection.execute(
            "DELETE FROM kg_documents WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        )
        return True

    def drop_collection(self, collection_id: str) -> None:
        """Remove every row of the collection's graph, its record included."""
        connection = self._store.connection()
        for table in _GRAPH_TABLES:
            connection.execute(f"DELETE FROM {table} WHERE collection_id = ?", (collection_id,))

    def extractor_counts(self, collection_id: str) -> dict[str, int]:
        """How many documents each extractor read."""
        rows = (
            self._store.connection()
            .execute(
                "SELECT extractor, COUNT(*) FROM kg_documents WHERE collection_id = ? GROUP BY extractor",
                (collection_id,),
            )
            .fetchall()
        )
        return {row[0]: int(row[1]) for row in rows}

    def record(self, collection_id: str, extractor: str, llm_model: str | None, updated_at: str) -> None:
        """Record which extractor built the graph and move its version on."""
        self._store.connection().execute(
            """INSERT INTO kg_collections (collection_id, extractor, llm_model, version, updated_at)
               VALUES (?, ?, ?, 1, ?)
               ON CONFLICT (collection_id) DO UPDATE SET extractor = excluded.extractor,
                   llm_model = COALESCE(excluded.llm_model, llm_model), version = version + 1,
                   updated_at = excluded.updated_at""",
            (collection_id, extractor, llm_model, updated_at),
        )

    # Read side
    def graph_record(self, collection_id: str) -> GraphRecord | None:
        """The collection's graph record, or None."""
        row = (
            self._store.connection()
            .execute(
                "SELECT extractor, llm_model, version, updated_at FROM kg_collections "
                "WHERE collection_id = ?",
                (collection_id,),
            )
            .fetchone()
        )
        return GraphRecord(row[0], row[1], int(row[2]), row[3]) if row else None

    def collections(self) -> list[tuple[str, GraphRecord]]:
        """Every collection with a graph; the version is the collection's data version."""
        rows = (
            self._store.connection()
            .execute(
                """SELECT g.collection_id, g.extractor, g.llm_model, COALESCE(v.version, 0), g.updated_at
                   FROM kg_collections g LEFT JOIN collection_versions v ON v.collection_id = g.collection_id
                   ORDER BY g.collection_id"""
            )
            .fetchall()
        )
        return [(row[0], GraphRecord(row[1], row[2], int(row[3]), row[4])) for row in rows]

    def counts(self, collection_id: str) -> dict[str, int]:
        """documents, entities, mentions and relations of the collection's graph."""
        connection = self._store.connection()
        tables = (
            ("documents", "kg_documents"),
            ("entities", "kg_entities"),
            ("mentions", "kg_mentions"),
            ("relations", "kg_relations"),
        )
        return {
            name: int(
                connection.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE collection_id = ?", (collection_id,)
                ).fetchone()[0]
            )
            for name, table in tables
        }

    def entity_count(self, collection_id: str) -> int:
        """The collection's entity rows, counted in the (collection_id, key) index."""
        row = (
            self._store.connection()
            .execute("SELECT COUNT(*) FROM kg_entities WHERE collection_id = ?", (collection_id,))
            .fetchone()
        )
        return int(row[0])

    def indexed_documents(self, collection_id: str) -> int:
        """How many documents the graph covers."""
        row = (
            self._store.connection()
            .execute("SELECT COUNT(*) FROM kg_documents WHERE collection_id = ?", (collection_id,))
            .fetchone()
        )
        return int(row[0])

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the documents the graph covers."""
        rows = (
            self._store.connection()
            .execute("SELECT document_id FROM kg_documents WHERE collection_id = ?", (collection_id,))
            .fetchall()
        )
        return {row[0] for row in rows}

    def entities(
        self, collection_id: str, min_documents: int, mentioned_by: set[str] | None = None
    ) -> list[StoredEntity]:
        """Every entity (or those the documents mention) by id; vectors of those in min_documents or more."""
        query = (
            "SELECT id, key, name, type, mention_count, document_count, "
            "CASE WHEN document_count >= ? THEN embedding END, document_count >= ? "
            "FROM kg_entities WHERE collection_id = ?"
        )
        cursor = self._store.connection().cursor()
        cursor.row_factory = None  # plain tuples: a graph has hundreds of thousands of entities
        if mentioned_by is None:
            # Holding a quarter of the table or more (ids never repeat: the largest bounds the rows), one
            # scan in id order beats a row lookup per entity through the (collection_id, key) index and a
            # sort: 180 against 320 ms for 102K entities. `+` keeps the planner off that index.
            largest = cursor.execute("SELECT MAX(id) FROM kg_entities").fetchone()[0] or 0
            column = "+collection_id" if 4 * self.entity_count(collection_id) >= largest else "collection_id"
            rows = cursor.execute(
                f"{query.replace('collection_id = ?', f'{column} = ?')} ORDER BY id",
                (min_documents, min_documents, collection_id),
            ).fetchall()
        else:
            found: dict[int, Any] = {}
            for batch in _batches(sorted(mentioned_by)):
                for row in cursor.execute(
                    f"""{query} AND id IN (SELECT entity_id FROM kg_mentions WHERE collection_id = ?
                        AND document_id IN ({_marks(batch)}))""",
                    (min_documents, min_documents, collection_id, collection_id, *batch),
                ):
                    found[row[0]] = row
            rows = [found[key] for key in sorted(found)]
        return [StoredEntity(EntityRow(*row[:6]), row[6], bool(row[7])) for row in rows]

    def entity_aliases(
        self, collection_id: str, document_ids: set[str] | None = None
    ) -> list[tuple[str, int]]:
        """Every distinct (alias, entity id) of the collection (or of these documents' alias rows)."""
        connection = self._store.connection()
        query = "SELECT DISTINCT alias, entity_id FROM kg_aliases WHERE collection_id = ?"
        if document_ids is None:
            rows = connection.execute(query, (collection_id,)).fetchall()
        else:
            rows = []
            for batch in _batches(sorted(document_ids)):
                rows += connection.execute(
                    f"{query} AND document_id IN ({_marks(batch)})", (collection_id, *batch)
                ).fetchall()
        return list(dict.fromkeys((row[0], int(row[1])) for row in rows))

    def alias_rows(self, collection_id: str) -> list[AliasRow]:
        """Every alias row of the collection as written."""
        rows = (
            self._store.connection()
            .execute(
                "SELECT alias, entity_id, document_id, surface FROM kg_aliases WHERE collection_id = ? "
                "ORDER BY entity_id, alias, document_id, surface",
                (collection_id,),
            )
            .fetchall()
        )
        return [AliasRow(row[0], int(row[1]), row[2], row[3]) for row in rows]

    def graph_documents(self, collection_id: str) -> list[GraphDocument]:
        """Every document the graph covers, by document id."""
        rows = (
            self._store.connection()
            .execute(
                "SELECT document_id, extractor, entities, relations, note FROM kg_documents "
                "WHERE collection_id = ? ORDER BY document_id",
                (collection_id,),
            )
            .fetchall()
        )
        return [GraphDocument(row[0], row[1], int(row[2]), int(row[3]), row[4]) for row in rows]

    def relation_ends(self, collection_id: str) -> list[tuple[int, int]]:
        """(source id, target id) of every relation, as plain tuples (hundreds of thousands of them)."""
        cursor = self._store.connection().cursor()
        cursor.row_factory = None
        rows: list[tuple[int, int]] = cursor.execute(
            "SELECT source_id, target_id FROM kg_relations WHERE collection_id = ?", (collection_id,)
        ).fetchall()
        return rows

    def relations_of(self, collection_id: str, entity_ids: list[int]) -> list[RelationRow]:
        """Every relation with one of the entities at either end."""
        connection = self._store.connection()
        found: dict[int, RelationRow] = {}
        for batch in _batches(sorted(set(entity_ids))):
            # One query per end, so that each uses its index (an OR of the two would scan the table).
            for end in ("source_id", "target_id"):
                for row in connection.execute(
                    f"SELECT id, source_id, target_id, type, weight FROM kg_relations "
                    f"WHERE {end} IN ({_marks(batch)}) AND collection_id = ?",
                    (*batch, collection_id),
                ).fetchall():
                    found[row[0]] = RelationRow(*row)
        return list(found.values())

    def evidence_of(self, relation_ids: list[int]) -> list[EvidenceRow]:
        """Every evidence row of the relations."""
        connection = self._store.connection()
        rows: list[EvidenceRow] = []
        for batch in _batches(sorted(set(relation_ids))):
            rows += [
                EvidenceRow(*row)
                for row in connection.execute(
                    "SELECT relation_id, document_id, chunk_id, count, field, start_char, end_char "
                    f"FROM kg_evidence WHERE relation_id IN ({_marks(batch)})",
                    tuple(batch),
                ).fetchall()
            ]
        return rows

    def mentions_of(self, entity_ids: list[int]) -> list[MentionRow]:
        """Every mention of the entities."""
        connection = self._store.connection()
        rows: list[MentionRow] = []
        for batch in _batches(sorted(set(entity_ids))):
            rows += [
                MentionRow(*row)
                for row in connection.execute(
                    "SELECT entity_id, document_id, chunk_id, field, start_char, end_char "
                    f"FROM kg_mentions WHERE entity_id IN ({_marks(batch)})",
                    tuple(batch),
                ).fetchall()
            ]
        return rows

    def aliases_of(self, entity_id: int) -> list[str]:
        """The abbreviations written for an entity, sorted."""
        rows = (
            self._store.connection()
            .execute(
                "SELECT DISTINCT surface FROM kg_aliases WHERE entity_id = ? ORDER BY surface", (entity_id,)
            )
            .fetchall()
        )
        return [row[0] for row in rows]
