"""KnowledgeGraphStorage on PostgreSQL: the kg_* tables of schema migration 6.

The same rows and rules as the SQLite storage; id lists travel as one array parameter (`= ANY(%s)`), so
nothing is cut into batches. Writes go through the thread's connection, so inside an ingest or a delete
they join its transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from psycopg.rows import tuple_row

from iris_rag.backends.postgres.store import PostgresStore
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


class PostgresKnowledgeGraph:
    """The graph's rows in the store's database."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def _rows(self, statement: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._store.connection().cursor(row_factory=tuple_row) as cursor:
            return cursor.execute(statement, parameters).fetchall()

    def _execute(self, statement: str, parameters: Sequence[Any] = ()) -> None:
        self._store.connection().execute(statement, parameters)

    def _many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            with self._store.connection().cursor() as cursor:
                cursor.executemany(statement, rows)

    # Write side
    def alias_votes(self, collection_id: str, aliases: list[str]) -> list[tuple[str, str, int]]:
        """(alias, entity key, count) for the given aliases."""
        rows = self._rows(
            """SELECT a.alias, e.key, COUNT(*) FROM kg_aliases a JOIN kg_entities e ON e.id = a.entity_id
               WHERE a.collection_id = %s AND a.alias = ANY(%s) GROUP BY a.alias, e.key ORDER BY 1, 2""",
            (collection_id, sorted(aliases)),
        )
        return [(row[0], row[1], int(row[2])) for row in rows]

    def ensure_entities(self, collection_id: str, entities: dict[str, tuple[str, str]]) -> list[EntityKey]:
        """Create the absent entities; every asked one with its id and whether it lacks a vector."""
        self._many(
            "INSERT INTO kg_entities (collection_id, key, name, type) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (collection_id, key) DO NOTHING",
            [(collection_id, key, name, kind) for key, (name, kind) in entities.items()],
        )
        rows = self._rows(
            "SELECT id, key, name, embedding IS NULL FROM kg_entities "
            "WHERE collection_id = %s AND key = ANY(%s)",
            (collection_id, list(entities)),
        )
        return [EntityKey(int(row[0]), row[1], row[2], bool(row[3])) for row in rows]

    def set_entity_vectors(self, vectors: list[tuple[int, npt.NDArray[np.float32]]]) -> None:
        """Store entities' name vectors (float32 bytes)."""
        self._many(
            "UPDATE kg_entities SET embedding = %s WHERE id = %s",
            [(np.ascontiguousarray(v, dtype=np.float32).tobytes(), i) for i, v in vectors],
        )

    def add(self, collection_id: str, write: GraphWrite) -> None:
        """Add mentions, counts, relation weights with their evidence, aliases and documents."""
        self._many(
            "INSERT INTO kg_mentions VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (collection_id, m.entity_id, m.document_id, m.chunk_id, m.field, m.start_char, m.end_char)
                for m in write.mentions
            ],
        )
        self._many(
            "UPDATE kg_entities SET mention_count = mention_count + %s, document_count = document_count + %s "
            "WHERE id = %s",
            [(mentions, documents, e) for e, (mentions, documents) in write.counts.items()],
        )
        evidence: list[tuple[Any, ...]] = []
        for relation in write.relations:
            relation_id = self._rows(
                """INSERT INTO kg_relations AS r (collection_id, source_id, target_id, type, weight)
                   VALUES (%s, %s, %s, %s, %s)
                   ON CONFLICT (collection_id, source_id, target_id, type)
                   DO UPDATE SET weight = r.weight + excluded.weight
                   RETURNING id""",
                (collection_id, relation.source_id, relation.target_id, relation.type, relation.weight),
            )[0][0]
            evidence += [
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
        self._many("INSERT INTO kg_evidence VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", evidence)
        self._many(
            "INSERT INTO kg_aliases VALUES (%s, %s, %s, %s, %s)",
            [(collection_id, a.alias, a.entity_id, a.document_id, a.surface) for a in write.aliases],
        )
        self._many(
            "INSERT INTO kg_documents VALUES (%s, %s, %s, %s, %s, %s)",
            [
                (collection_id, d.document_id, d.extractor, d.entities, d.relations, d.note)
                for d in write.documents
            ],
        )

    def delete_document(self, collection_id: str, document_id: str) -> bool:
        """Take a document out of the graph, counts and weights with it; False if it was not covered."""
        key = (collection_id, document_id)
        if not self._rows("SELECT 1 FROM kg_documents WHERE collection_id = %s AND document_id = %s", key):
            return False
        weights = self._rows(
            "SELECT relation_id, SUM(count) FROM kg_evidence WHERE collection_id = %s AND document_id = %s "
            "GROUP BY relation_id",
            key,
        )
        self._many(
            "UPDATE kg_relations SET weight = weight - %s WHERE id = %s", [(w[1], w[0]) for w in weights]
        )
        self._execute("DELETE FROM kg_evidence WHERE collection_id = %s AND document_id = %s", key)
        self._execute(
            "DELETE FROM kg_relations WHERE weight <= 0 AND id = ANY(%s)", ([w[0] for w in weights],)
        )
        mentioned = self._rows(
            "SELECT entity_id, COUNT(*) FROM kg_mentions WHERE collection_id = %s AND document_id = %s "
            "GROUP BY entity_id",
            key,
        )
        self._many(
            "UPDATE kg_entities SET mention_count = mention_count - %s, document_count = document_count - 1 "
            "WHERE id = %s",
            [(m[1], m[0]) for m in mentioned],
        )
        self._execute("DELETE FROM kg_mentions WHERE collection_id = %s AND document_id = %s", key)
        gone = [
            row[0]
            for row in self._rows(
                "SELECT id FROM kg_entities WHERE mention_count <= 0 AND id = ANY(%s)",
                ([m[0] for m in mentioned],),
            )
        ]
        if gone:
            # Their relations lost all evidence with the mentions; this only guards against drift.
            ends = "source_id = ANY(%s) OR target_id = ANY(%s)"
            self._execute(
                f"DELETE FROM kg_evidence WHERE relation_id IN (SELECT id FROM kg_relations WHERE {ends})",
                (gone, gone),
            )
            self._execute(f"DELETE FROM kg_relations WHERE {ends}", (gone, gone))
            self._execute("DELETE FROM kg_aliases WHERE entity_id = ANY(%s)", (gone,))
            self._execute("DELETE FROM kg_entities WHERE id = ANY(%s)", (gone,))
        self._execute("DELETE FROM kg_aliases WHERE collection_id = %s AND document_id = %s", key)
        self._execute("DELETE FROM kg_documents WHERE collection_id = %s AND document_id = %s", key)
        return True

    def drop_collection(self, collection_id: str) -> None:
        """Remove every row of the collection's graph, its record included."""
        for table in _GRAPH_TABLES:
            self._execute(f"DELETE FROM {table} WHERE collection_id = %s", (collection_id,))

    def extractor_counts(self, collection_id: str) -> dict[str, int]:
        """How many documents each extractor read."""
        rows = self._rows(
            "SELECT extractor, COUNT(*) FROM kg_documents WHERE collection_id = %s GROUP BY extractor",
            (collection_id,),
        )
        return {row[0]: int(row[1]) for row in rows}

    def record(self, collection_id: str, extractor: str, llm_model: str | None, updated_at: str) -> None:
        """Record which extractor built the graph and move its version on."""
        self._execute(
            """INSERT INTO kg_collections AS g (collection_id, extractor, llm_model, version, updated_at)
               VALUES (%s, %s, %s, 1, %s)
               ON CONFLICT (collection_id) DO UPDATE SET extractor = excluded.extractor,
                   llm_model = COALESCE(excluded.llm_model, g.llm_model), version = g.version + 1,
                   updated_at = excluded.updated_at""",
            (collection_id, extractor, llm_model, updated_at),
        )

    # Read side
    def graph_record(self, collection_id: str) -> GraphRecord | None:
        """The collection's graph record, or None."""
        rows = self._rows(
            "SELECT extractor, llm_model, version, updated_at FROM kg_collections WHERE collection_id = %s",
            (collection_id,),
        )
        return GraphRecord(rows[0][0], rows[0][1], int(rows[0][2]), rows[0][3]) if rows else None

    def collections(self) -> list[tuple[str, GraphRecord]]:
        """Every collection with a graph; the version is the collection's data version."""
        rows = self._rows(
            """SELECT g.collection_id, g.extractor, g.llm_model, COALESCE(v.version, 0), g.updated_at
               FROM kg_collections g LEFT JOIN collection_versions v ON v.collection_id = g.collection_id
               ORDER BY g.collection_id"""
        )
        return [(row[0], GraphRecord(row[1], row[2], int(row[3]), row[4])) for row in rows]

    def counts(self, collection_id: str) -> dict[str, int]:
        """documents, entities, mentions and relations of the collection's graph."""
        row = self._rows(
            """SELECT (SELECT COUNT(*) FROM kg_documents WHERE collection_id = %s),
                      (SELECT COUNT(*) FROM kg_entities WHERE collection_id = %s),
                      (SELECT COUNT(*) FROM kg_mentions WHERE collection_id = %s),
                      (SELECT COUNT(*) FROM kg_relations WHERE collection_id = %s)""",
            (collection_id,) * 4,
        )[0]
        return dict(zip(("documents", "entities", "mentions", "relations"), map(int, row), strict=True))

    def entity_count(self, collection_id: str) -> int:
        """The collection's entity rows."""
        return int(
            self._rows("SELECT COUNT(*) FROM kg_entities WHERE collection_id = %s", (collection_id,))[0][0]
        )

    def indexed_documents(self, collection_id: str) -> int:
        """How many documents the graph covers."""
        return int(
            self._rows("SELECT COUNT(*) FROM kg_documents WHERE collection_id = %s", (collection_id,))[0][0]
        )

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the documents the graph covers."""
        return {
            row[0]
            for row in self._rows(
                "SELECT document_id FROM kg_documents WHERE collection_id = %s", (collection_id,)
            )
        }

    def entities(
        self, collection_id: str, min_documents: int, mentioned_by: set[str] | None = None
    ) -> list[StoredEntity]:
        """Every entity (or those the documents mention) by id; vectors of those in min_documents or more."""
        chosen = (
            ""
            if mentioned_by is None
            else " AND id IN (SELECT entity_id FROM kg_mentions WHERE collection_id = %s "
            "AND document_id = ANY(%s))"
        )
        rows = self._rows(
            "SELECT id, key, name, type, mention_count, document_count, "
            "CASE WHEN document_count >= %s THEN embedding END, document_count >= %s "
            f"FROM kg_entities WHERE collection_id = %s{chosen} ORDER BY id",
            (min_documents, min_documents, collection_id)
            + (() if mentioned_by is None else (collection_id, sorted(mentioned_by))),
        )
        return [
            StoredEntity(EntityRow(*row[:6]), bytes(row[6]) if row[6] is not None else None, bool(row[7]))
            for row in rows
        ]

    def entity_aliases(
        self, collection_id: str, document_ids: set[str] | None = None
    ) -> list[tuple[str, int]]:
        """Every distinct (alias, entity id) of the collection (or of these documents' alias rows)."""
        chosen = "" if document_ids is None else " AND document_id = ANY(%s)"
        rows = self._rows(
            f"SELECT DISTINCT alias, entity_id FROM kg_aliases WHERE collection_id = %s{chosen}",
            (collection_id,) if document_ids is None else (collection_id, sorted(document_ids)),
        )
        return [(row[0], int(row[1])) for row in rows]

    def alias_rows(self, collection_id: str) -> list[AliasRow]:
        """Every alias row of the collection as written."""
        rows = self._rows(
            "SELECT alias, entity_id, document_id, surface FROM kg_aliases WHERE collection_id = %s "
            "ORDER BY entity_id, alias, document_id, surface",
            (collection_id,),
        )
        return [AliasRow(row[0], int(row[1]), row[2], row[3]) for row in rows]

    def graph_documents(self, collection_id: str) -> list[GraphDocument]:
        """Every document the graph covers, by document id."""
        rows = self._rows(
            "SELECT document_id, extractor, entities, relations, note FROM kg_documents "
            "WHERE collection_id = %s ORDER BY document_id",
            (collection_id,),
        )
        return [GraphDocument(row[0], row[1], int(row[2]), int(row[3]), row[4]) for row in rows]

    def relation_ends(self, collection_id: str) -> list[tuple[int, int]]:
        """(source id, target id) of every relation."""
        rows = self._rows(
            "SELECT source_id, target_id FROM kg_relations WHERE collection_id = %s", (collection_id,)
        )
        return [(int(row[0]), int(row[1])) for row in rows]

    def relations_of(self, collection_id: str, entity_ids: list[int]) -> list[RelationRow]:
        """Every relation with one of the entities at either end."""
        ids = sorted(set(entity_ids))
        found: dict[int, RelationRow] = {}
        # One query per end, so that each uses its index.
        for end in ("source_id", "target_id"):
            for row in self._rows(
                f"SELECT id, source_id, target_id, type, weight FROM kg_relations "
                f"WHERE {end} = ANY(%s) AND collection_id = %s",
                (ids, collection_id),
            ):
                found[row[0]] = RelationRow(*row)
        return list(found.values())

    def evidence_of(self, relation_ids: list[int]) -> list[EvidenceRow]:
        """Every evidence row of the relations."""
        rows = self._rows(
            "SELECT relation_id, document_id, chunk_id, count, field, start_char, end_char "
            "FROM kg_evidence WHERE relation_id = ANY(%s)",
            (sorted(set(relation_ids)),),
        )
        return [EvidenceRow(*row) for row in rows]

    def mentions_of(self, entity_ids: list[int]) -> list[MentionRow]:
        """Every mention of the entities."""
        rows = self._rows(
            "SELECT entity_id, document_id, chunk_id, field, start_char, end_char "
            "FROM kg_mentions WHERE entity_id = ANY(%s)",
            (sorted(set(entity_ids)),),
        )
        return [MentionRow(*row) for row in rows]

    def aliases_of(self, entity_id: int) -> list[str]:
        """The abbreviations written for an entity, sorted."""
        rows = self._rows(
            "SELECT DISTINCT surface FROM kg_aliases WHERE entity_id = %s ORDER BY surface", (entity_id,)
        )
        return [row[0] for row in rows]
