"""The knowledge graph of a collection: entities, their mentions and the relations between them.

Kept in the store's own SQLite file, in step with the documents (TechniqueIndex): extraction and the
embedding of new entity names happen in prepare(), outside any transaction; write() and delete() run inside
the store's transaction, so a replaced or deleted document takes its mentions, its relation evidence and
the weight that evidence gave each relation with it, and an entity left with no mention goes too.

Tables (every row carries its collection):
- kg_collections: one row per collection: which extractor built its graph, and a version bumped by every
  change (query-time caches key on it).
- kg_documents: the documents the graph covers, each with the extractor that read it.
- kg_entities: key (normalised name), display name, type, mention and document counts, and the name's
  embedding (computed in prepare(), stored with the entity; NULL for graphs built before it was stored).
- kg_aliases: abbreviation -> entity, per defining document ("TNF" -> tumor necrosis factor).
- kg_mentions: entity, document, chunk, field (title or content) and character offsets in that field.
- kg_relations: source, target, type and weight, the weight being the sum of the evidence counts.
- kg_evidence: relation, chunk, how many units (sentences, or the chunk for the LLM) state it there,
  and the span of the first one.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.cancellation import check_cancelled
from iris_rag.embedder import Embedder
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentInput, DocumentStore
from iris_rag.stores.versioned import VersionedCache
from iris_rag.techniques.graphrag.extraction import (
    ChatClient,
    DocumentGraph,
    ExtractionFailedError,
    LlmExtractor,
    Mention,
    RuleExtractor,
    Unit,
    entity_key,
)

logger = logging.getLogger(__name__)

_BATCH = 500  # ids per IN (...) list
# Entity names are embedded at ingest (prepare) and stored with the entity. A query compares the query's
# phrases with every name in graphs of up to this many entities, else with those mentioned by 2+ documents.
EMBED_ALL_ENTITIES_UP_TO = 20_000
MIN_DOCUMENTS_TO_EMBED = 2
NAME_ENCODE_BATCH = 1024  # names per encoder call: short calls, a cancellation checkpoint between them

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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def text_hash(text: str) -> bytes:
    """The embedding cache's key for a text (as the ingestor computes it)."""
    return hashlib.sha256(text.encode("utf-8")).digest()[:16]


def chunk_id_of(document_id: str, chunk_index: int) -> str:
    """A chunk's id, as the store assigns it."""
    return f"{document_id}#{chunk_index}"


def _batches(items: Sequence[Any], size: int = _BATCH) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _marks(items: Sequence[Any]) -> str:
    return ",".join("?" * len(items))


@dataclass
class PreparedDocument:
    """One document's extraction, with each unit placed in a chunk."""

    graph: DocumentGraph
    unit_chunks: list[int]


@dataclass
class PreparedGraphs:
    """What prepare() hands to write(): an extraction per document, and every mentioned name's vector."""

    documents: dict[str, PreparedDocument] = field(default_factory=dict)
    name_vectors: dict[str, npt.NDArray[np.float32]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EntityRow:
    """An entity as the query side sees it."""

    id: int
    key: str
    name: str
    type: str
    mention_count: int
    document_count: int


@dataclass
class EntityTable:
    """A collection's entities, aliases and name vectors, loaded once per data version."""

    documents: int
    rows: list[EntityRow]
    row_of_id: dict[int, int]
    id_of_key: dict[str, int]
    ids_of_alias: dict[str, list[int]]
    keys: list[str]
    # Name vectors of the entities that are embedded (vector_rows[i] is the position in rows of vectors[i]).
    vector_rows: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]

    def specificity(self, entity_id: int) -> float:
        """How specific an entity is to few documents, in [0, 1] (normalised IDF)."""
        row = self.rows[self.row_of_id[entity_id]]
        return specificity(row.document_count, self.documents)


def specificity(document_count: int, documents: int) -> float:
    """log((N + 1) / (df + 0.5)) / log(N + 2), clipped to [0, 1]: near 1 when rare, 0 when everywhere."""
    if documents <= 0:
        return 0.0
    value = math.log((documents + 1) / (document_count + 0.5)) / math.log(documents + 2)
    return min(1.0, max(0.0, value))


@dataclass(frozen=True, slots=True)
class RelationRow:
    """A relation between two entities."""

    id: int
    source_id: int
    target_id: int
    type: str
    weight: int


@dataclass(frozen=True, slots=True)
class EvidenceRow:
    """Where a relation is stated."""

    relation_id: int
    document_id: str
    chunk_id: str
    count: int
    field: str
    start_char: int
    end_char: int


@dataclass(frozen=True, slots=True)
class MentionRow:
    """Where an entity is mentioned."""

    entity_id: int
    document_id: str
    chunk_id: str
    field: str
    start_char: int
    end_char: int


class KnowledgeGraphIndex:
    """TechniqueIndex of rag_graphrag: entities, mentions and weighted relations per collection."""

    name = "knowledge_graph"

    def __init__(self, settings: Settings, store: DocumentStore, embedder: Embedder) -> None:
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.rules = RuleExtractor()
        self.llm: LlmExtractor | None = (
            LlmExtractor(ChatClient(settings)) if settings.llm_provider == "openai" else None
        )
        self._tables: VersionedCache[EntityTable] = VersionedCache()
        self._components: VersionedCache[int] = VersionedCache()

    @property
    def extractor_name(self) -> str:
        """The extractor new documents go through: "llm" when an LLM is configured, else "rules"."""
        return "llm" if self.llm is not None else "rules"

    # TechniqueIndex
    def create_tables(self) -> None:
        """Create the graph tables if absent; give a graph from before stored name vectors their column."""
        connection = sqlite_connection(self.store)
        connection.executescript(_SCHEMA)
        columns = {row[1] for row in connection.execute("PRAGMA table_info(kg_entities)").fetchall()}
        if "embedding" not in columns:
            connection.execute("ALTER TABLE kg_entities ADD COLUMN embedding BLOB")

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> PreparedGraphs:
        """Extract entities and relations from each document, place each unit in its chunk, embed the names.

        Every name a mention gives is embedded here, outside the transaction, so that write() stores each
        new entity with its vector and no query ever embeds the graph.
        """
        prepared = PreparedGraphs()
        for document in documents:
            graph = self._extract(document)
            prepared.documents[document.id] = PreparedDocument(graph, _unit_chunks(graph.units, document))
        names = [m.name for item in prepared.documents.values() for m in item.graph.mentions]
        prepared.name_vectors = self.name_vectors(names)
        return prepared

    def _extract(self, document: DocumentInput) -> DocumentGraph:
        if self.llm is None:
            return self.rules.extract(document.title, document.content)
        try:
            return self.llm.extract_chunks(
                document.title, [(c.start_char, c.end_char, c.content) for c in document.chunks]
            )
        except ExtractionFailedError as exc:
            logger.warning("LLM extraction failed for %s, using the rules instead: %s", document.id, exc)
            graph = self.rules.extract(document.title, document.content)
            graph.extractor = "rules_fallback"
            graph.note = str(exc)[:500]
            return graph

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Store the documents' entities, mentions, relations (adding to their weights) and evidence."""
        connection = sqlite_connection(self.store)
        assert isinstance(prepared, PreparedGraphs)
        items = [(d, prepared.documents[d.id]) for d in documents if d.id in prepared.documents]
        resolve = self._resolve_abbreviations(connection, collection_id, [p.graph for _, p in items])

        # Entities: the first mention of a key names it and gives its type.
        # Entities: the first mention of a key names it and gives its type, unless a later one spells the key
        # itself out (the expansion of an abbreviation rather than the abbreviation).
        names: dict[str, tuple[str, str]] = {}
        for _, item in items:
            for mention in item.graph.mentions:
                key = resolve.get(mention.key, mention.key)
                current = names.get(key)
                if current is None or (entity_key(current[0]) != key and entity_key(mention.name) == key):
                    names[key] = (mention.name, mention.type)
        connection.executemany(
            "INSERT OR IGNORE INTO kg_entities (collection_id, key, name, type) VALUES (?, ?, ?, ?)",
            [(collection_id, key, name, kind) for key, (name, kind) in names.items()],
        )
        ids: dict[str, int] = {}
        unembedded: list[tuple[bytes, int]] = []
        for batch in _batches(list(names)):
            rows = connection.execute(
                "SELECT id, key, name, embedding IS NULL FROM kg_entities "
                f"WHERE collection_id = ? AND key IN ({_marks(batch)})",
                (collection_id, *batch),
            ).fetchall()
            ids.update({row[1]: row[0] for row in rows})
            # New entities (and old ones stored before vectors were) get the vector of their stored name.
            unembedded += [
                (_blob(prepared.name_vectors[row[2]]), row[0])
                for row in rows
                if row[3] and row[2] in prepared.name_vectors
            ]
        connection.executemany("UPDATE kg_entities SET embedding = ? WHERE id = ?", unembedded)

        mention_rows: list[tuple[Any, ...]] = []
        alias_rows: list[tuple[Any, ...]] = []
        mention_counts: Counter[int] = Counter()
        document_counts: Counter[int] = Counter()
        weights: Counter[tuple[int, int, str]] = Counter()
        evidence: dict[tuple[int, int, str], dict[str, list[Any]]] = defaultdict(dict)
        document_rows: list[tuple[Any, ...]] = []
        for document, item in items:
            graph = item.graph
            for mention in graph.mentions:
                entity = ids[resolve.get(mention.key, mention.key)]
                chunk = chunk_id_of(document.id, item.unit_chunks[mention.unit])
                mention_rows.append(
                    (collection_id, entity, document.id, chunk, mention.field, mention.start, mention.end)
                )
                mention_counts[entity] += 1
            for entity in {ids[resolve.get(m.key, m.key)] for m in graph.mentions}:
                document_counts[entity] += 1
            relation_count = 0
            for relation in graph.relations:
                source, target = (
                    resolve.get(relation.source, relation.source),
                    resolve.get(relation.target, relation.target),
                )
                if source == target:
                    continue
                if relation.type == "co_occurs" and target < source:
                    source, target = target, source
                triple = (ids[source], ids[target], relation.type)
                weights[triple] += 1
                relation_count += 1
                unit = graph.units[relation.unit]
                chunk = chunk_id_of(document.id, item.unit_chunks[relation.unit])
                slot = evidence[triple].setdefault(chunk, [document.id, 0, unit.field, unit.start, unit.end])
                slot[1] += 1
            for short, long in graph.aliases.items():
                if long in ids:
                    surface = graph.short_forms.get(short, short)
                    alias_rows.append((collection_id, short, ids[long], document.id, surface))
            document_rows.append(
                (
                    collection_id,
                    document.id,
                    graph.extractor,
                    len({m.key for m in graph.mentions}),
                    relation_count,
                    graph.note,
                )
            )

        connection.executemany(
            "INSERT INTO kg_mentions VALUES (?, ?, ?, ?, ?, ?, ?)",
            mention_rows,
        )
        connection.executemany(
            "UPDATE kg_entities SET mention_count = mention_count + ?, document_count = document_count + ? "
            "WHERE id = ?",
            [(mention_counts[e], document_counts[e], e) for e in mention_counts],
        )
        evidence_rows: list[tuple[Any, ...]] = []
        for triple, weight in weights.items():
            relation_id = connection.execute(
                """INSERT INTO kg_relations (collection_id, source_id, target_id, type, weight)
                   VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT (collection_id, source_id, target_id, type)
                   DO UPDATE SET weight = weight + excluded.weight
                   RETURNING id""",
                (collection_id, *triple, weight),
            ).fetchone()[0]
            for chunk, (document_id, count, text_field, start, end) in evidence[triple].items():
                evidence_rows.append(
                    (relation_id, collection_id, document_id, chunk, count, text_field, start, end)
                )
        connection.executemany("INSERT INTO kg_evidence VALUES (?, ?, ?, ?, ?, ?, ?, ?)", evidence_rows)
        connection.executemany("INSERT INTO kg_aliases VALUES (?, ?, ?, ?, ?)", alias_rows)
        connection.executemany("INSERT INTO kg_documents VALUES (?, ?, ?, ?, ?, ?)", document_rows)
        self._touch(connection, collection_id)

    def _resolve_abbreviations(
        self, connection: sqlite3.Connection, collection_id: str, graphs: list[DocumentGraph]
    ) -> dict[str, str]:
        """Abbreviations a document uses without defining them -> the expansion defined elsewhere.

        Definitions in this batch and in the collection's documents count; the most frequent wins.
        """
        wanted = {m.key for g in graphs for m in g.mentions if m.resolvable}
        if not wanted:
            return {}
        votes: dict[str, Counter[str]] = defaultdict(Counter)
        for graph in graphs:
            for short, long in graph.aliases.items():
                if short in wanted:
                    votes[short][long] += 1
        keys = sorted(wanted)
        for batch in _batches(keys):
            rows = connection.execute(
                f"""SELECT a.alias, e.key, COUNT(*) FROM kg_aliases a JOIN kg_entities e ON e.id = a.entity_id
                    WHERE a.collection_id = ? AND a.alias IN ({_marks(batch)}) GROUP BY a.alias, e.key""",
                (collection_id, *batch),
            ).fetchall()
            for alias, key, count in rows:
                votes[alias][key] += count
        return {
            short: min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0] for short, counter in votes.items()
        }

    def delete(self, collection_id: str, document_id: str) -> None:
        """Drop a document's mentions and evidence, subtract its counts from the weights, drop empty rows."""
        connection = sqlite_connection(self.store)
        known = connection.execute(
            "SELECT 1 FROM kg_documents WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        ).fetchone()
        if known is None:
            return
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
        self._touch(connection, collection_id)

    def _touch(self, connection: sqlite3.Connection, collection_id: str) -> None:
        """Bump the graph's version and record which extractor(s) built it."""
        by_extractor = dict(
            connection.execute(
                "SELECT extractor, COUNT(*) FROM kg_documents WHERE collection_id = ? GROUP BY extractor",
                (collection_id,),
            ).fetchall()
        )
        extractor = (
            next(iter(by_extractor)) if len(by_extractor) == 1 else "mixed" if by_extractor else "none"
        )
        model = self.llm.model_name if self.llm is not None and "llm" in by_extractor else None
        connection.execute(
            """INSERT INTO kg_collections (collection_id, extractor, llm_model, version, updated_at)
               VALUES (?, ?, ?, 1, ?)
               ON CONFLICT (collection_id) DO UPDATE SET extractor = excluded.extractor,
                   llm_model = COALESCE(excluded.llm_model, llm_model), version = version + 1,
                   updated_at = excluded.updated_at""",
            (collection_id, extractor, model, _now()),
        )

    def stats(self) -> dict[str, Any]:
        """Per collection: documents, entities, mentions, relations, extractor and the largest component."""
        connection = sqlite_connection(self.store)
        collections: dict[str, Any] = {}
        for collection_id, extractor, llm_model, version in connection.execute(
            """SELECT g.collection_id, g.extractor, g.llm_model, COALESCE(v.version, 0) FROM kg_collections g
               LEFT JOIN collection_versions v ON v.collection_id = g.collection_id
               ORDER BY g.collection_id"""
        ).fetchall():
            counts = {
                name: connection.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE collection_id = ?", (collection_id,)
                ).fetchone()[0]
                for name, table in (
                    ("documents", "kg_documents"),
                    ("entities", "kg_entities"),
                    ("mentions", "kg_mentions"),
                    ("relations", "kg_relations"),
                )
            }
            collections[collection_id] = {
                "extractor": extractor,
                **({"llm_model": llm_model} if llm_model else {}),
                **counts,
                "largest_component": self.largest_component(connection, collection_id, version),
                "extractors": self.extractor_counts(connection, collection_id),
            }
        return {"collections": collections}

    def largest_component(self, connection: sqlite3.Connection, collection_id: str, version: int) -> int:
        """Entities in the largest connected component (union-find; once per data version)."""
        return self._components.get(
            collection_id, version, lambda: _largest_component(connection, collection_id)
        )

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents the graph covers."""
        connection = sqlite_connection(self.store)
        row = connection.execute(
            "SELECT COUNT(*) FROM kg_documents WHERE collection_id = ?", (collection_id,)
        ).fetchone()
        return int(row[0])

    # Query side
    def collection_info(self, collection_id: str) -> dict[str, Any]:
        """The collection's graph record: extractor, LLM model, version, update time."""
        row = (
            sqlite_connection(self.store)
            .execute(
                "SELECT extractor, llm_model, version, updated_at FROM kg_collections "
                "WHERE collection_id = ?",
                (collection_id,),
            )
            .fetchone()
        )
        if row is None:
            return {"extractor": "none", "llm_model": None, "version": 0, "updated_at": None}
        return {"extractor": row[0], "llm_model": row[1], "version": row[2], "updated_at": row[3]}

    def extractor_counts(self, connection: sqlite3.Connection, collection_id: str) -> dict[str, int]:
        """How many documents each extractor read (llm, rules, rules_fallback)."""
        return {
            row[0]: row[1]
            for row in connection.execute(
                "SELECT extractor, COUNT(*) FROM kg_documents WHERE collection_id = ? GROUP BY extractor",
                (collection_id,),
            ).fetchall()
        }

    def entity_table(self, collection_id: str, version: int) -> EntityTable:
        """The collection's entities with their name vectors, loaded once per data version (read before)."""
        return self._tables.get(collection_id, version, lambda: self._load_entities(collection_id))

    def _load_entities(self, collection_id: str) -> EntityTable:
        connection = sqlite_connection(self.store)
        total = connection.execute(
            "SELECT COUNT(*) FROM kg_entities WHERE collection_id = ?", (collection_id,)
        ).fetchone()[0]
        # Large graphs compare the query with the names of the entities that connect documents; the long
        # tail of entities mentioned by one document still links exactly and fuzzily.
        min_documents = 1 if total <= EMBED_ALL_ENTITIES_UP_TO else MIN_DOCUMENTS_TO_EMBED
        rows: list[EntityRow] = []
        embedded: list[int] = []
        blobs: list[bytes | None] = []
        for row in connection.execute(
            "SELECT id, key, name, type, mention_count, document_count, "
            "CASE WHEN document_count >= ? THEN embedding END, document_count >= ? "
            "FROM kg_entities WHERE collection_id = ? ORDER BY id",
            (min_documents, min_documents, collection_id),
        ):
            if row[7]:
                embedded.append(len(rows))
                blobs.append(row[6])
            rows.append(EntityRow(*row[:6]))
        aliases: dict[str, list[int]] = defaultdict(list)
        for alias, entity_id in connection.execute(
            "SELECT DISTINCT alias, entity_id FROM kg_aliases WHERE collection_id = ?", (collection_id,)
        ).fetchall():
            aliases[alias].append(entity_id)
        return EntityTable(
            documents=self.indexed_documents(collection_id),
            rows=rows,
            row_of_id={r.id: i for i, r in enumerate(rows)},
            id_of_key={r.key: r.id for r in rows},
            ids_of_alias=dict(aliases),
            keys=[r.key for r in rows],
            vector_rows=np.array(embedded, dtype=np.int64),
            vectors=self._stored_vectors(collection_id, [rows[i].name for i in embedded], blobs),
        )

    def _stored_vectors(
        self, collection_id: str, names: list[str], blobs: list[bytes | None]
    ) -> npt.NDArray[np.float32]:
        """The stored name vectors; names stored without one (a graph built before) are embedded now."""
        if not names:
            return np.zeros((0, self.embedder.dimension), dtype=np.float32)
        missing = [name for name, blob in zip(names, blobs, strict=True) if blob is None]
        if not missing:  # one join and one view: stacking 9,000 small arrays took 0.2 s of a cold call
            stored = np.frombuffer(b"".join(b for b in blobs if b is not None), dtype=np.float32)
            return stored.reshape(len(blobs), -1)
        fresh = self.name_vectors(missing)
        logger.warning(
            "the graph of %r was built before entity vectors were stored: %d names embedded at query "
            "time (kept in the embedding cache); `iris-rag reindex --collection %s` stores them",
            collection_id,
            len(missing),
            collection_id,
        )
        return np.stack(
            [
                fresh[name] if blob is None else np.frombuffer(blob, dtype=np.float32)
                for name, blob in zip(names, blobs, strict=True)
            ]
        ).astype(np.float32, copy=False)

    def name_vectors(self, names: list[str]) -> dict[str, npt.NDArray[np.float32]]:
        """Each distinct name's vector: from the store's embedding cache, else encoded (and cached)."""
        unique = list(dict.fromkeys(names))
        if not unique:
            return {}
        model = self.settings.embedding_model
        hashes = {text_hash(n): n for n in unique}
        cached = self.store.cached_embeddings(model, list(hashes))
        vectors = {hashes[h]: vector for h, vector in cached.items()}
        fresh = [(h, n) for h, n in hashes.items() if h not in cached]
        for batch in _batches(fresh, NAME_ENCODE_BATCH):
            check_cancelled()  # between encoder calls: a cancelled ingest stops here
            encoded = self.embedder.encode([n for _, n in batch], batch_size=256)
            self.store.cache_embeddings(model, [(h, encoded[i]) for i, (h, _) in enumerate(batch)])
            vectors.update({n: encoded[i] for i, (_, n) in enumerate(batch)})
        return vectors

    def relations_of(self, collection_id: str, entity_ids: Iterable[int]) -> list[RelationRow]:
        """Every relation with one of the entities at either end."""
        connection = sqlite_connection(self.store)
        wanted = sorted(set(entity_ids))
        found: dict[int, RelationRow] = {}
        for batch in _batches(wanted):
            # One query per end, so that each uses its index (an OR of the two would scan the table).
            for end in ("source_id", "target_id"):
                for row in connection.execute(
                    f"SELECT id, source_id, target_id, type, weight FROM kg_relations "
                    f"WHERE {end} IN ({_marks(batch)}) AND collection_id = ?",
                    (*batch, collection_id),
                ).fetchall():
                    found[row[0]] = RelationRow(*row)
        return list(found.values())

    def evidence_of(self, relation_ids: Iterable[int]) -> list[EvidenceRow]:
        """Every evidence row of the relations."""
        connection = sqlite_connection(self.store)
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

    def mentions_of(self, entity_ids: Iterable[int]) -> list[MentionRow]:
        """Every mention of the entities."""
        connection = sqlite_connection(self.store)
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
        """The abbreviations that stand for an entity, as written."""
        rows = (
            sqlite_connection(self.store)
            .execute(
                "SELECT DISTINCT surface FROM kg_aliases WHERE entity_id = ? ORDER BY surface", (entity_id,)
            )
            .fetchall()
        )
        return [row[0] for row in rows]


def _blob(vector: npt.NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def _largest_component(connection: sqlite3.Connection, collection_id: str) -> int:
    """Entities in the largest connected component of the collection's graph (union-find)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = parent.setdefault(x, x)
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    for source, target in connection.execute(
        "SELECT source_id, target_id FROM kg_relations WHERE collection_id = ?", (collection_id,)
    ):
        a, b = find(source), find(target)
        if a != b:
            parent[a] = b
    sizes = Counter(find(x) for x in list(parent))
    entities = connection.execute(
        "SELECT COUNT(*) FROM kg_entities WHERE collection_id = ?", (collection_id,)
    ).fetchone()[0]
    return max(sizes.values(), default=1 if entities else 0)


def _unit_chunks(units: list[Unit], document: DocumentInput) -> list[int]:
    """The chunk each unit belongs to: the first that holds it whole (title units go to the first chunk).

    Chunks come in text order (starts and ends ascending): a binary search finds the first chunk that
    can hold a unit, so placing every unit is not quadratic in the document's length.
    """
    chunks = document.chunks
    starts = [c.start_char for c in chunks]
    ends = [c.end_char for c in chunks]
    in_order = starts == sorted(starts) and ends == sorted(ends)
    placed: list[int] = []
    for unit in units:
        if unit.field == "title" or not chunks:
            placed.append(chunks[0].index if chunks else 0)
            continue
        candidates = chunks
        if in_order:
            first = bisect.bisect_left(ends, unit.end)  # the first chunk ending at or after the unit
            if first < len(chunks) and starts[first] <= unit.start:
                placed.append(chunks[first].index)
                continue
            # Not held whole (a sentence longer than a chunk): the most overlap is among the overlapping.
            overlapping = chunks[bisect.bisect_right(ends, unit.start) : bisect.bisect_left(starts, unit.end)]
            candidates = overlapping or chunks
        holder = next(
            (c.index for c in candidates if c.start_char <= unit.start and unit.end <= c.end_char), None
        )
        if holder is None:
            holder = max(
                candidates, key=lambda c: min(c.end_char, unit.end) - max(c.start_char, unit.start)
            ).index
        placed.append(holder)
    return placed


__all__ = ["KnowledgeGraphIndex", "Mention", "PreparedGraphs", "specificity"]
