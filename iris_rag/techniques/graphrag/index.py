"""The knowledge graph of a collection: entities, their mentions and the relations between them.

Kept in the store through KnowledgeGraphStorage (storage.py; each backend has its own), in step with
the documents (TechniqueIndex): extraction and the
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
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from iris_rag.cancellation import check_cancelled
from iris_rag.encoder import TextEncoder
from iris_rag.llm import TechniqueLLM
from iris_rag.retrieval import vocabulary
from iris_rag.settings import Settings
from iris_rag.stores.appended import Column
from iris_rag.stores.base import CacheItem, CacheOwner, DocumentInput, DocumentStore, cache_key
from iris_rag.stores.versioned import VersionedCache, update_limit
from iris_rag.techniques.graphrag.extraction import (
    DocumentGraph,
    ExtractionFailedError,
    LlmExtractor,
    Mention,
    RuleExtractor,
    Unit,
    entity_key,
)
from iris_rag.techniques.graphrag.storage import (
    AliasRow,
    EntityRow,
    EvidenceRow,
    GraphDocument,
    GraphWrite,
    KnowledgeGraphStorage,
    MentionRow,
    NewEvidence,
    NewRelation,
    RelationRow,
    StoredEntity,
)
from iris_rag.text import chunk_id

logger = logging.getLogger(__name__)

# Entity names are embedded at ingest (prepare) and stored with the entity. A query compares the query's
# phrases with every name in graphs of up to this many entities, else with those mentioned by 2+ documents.
EMBED_ALL_ENTITIES_UP_TO = 20_000
MIN_DOCUMENTS_TO_EMBED = 2
NAME_ENCODE_BATCH = 1024  # names per encoder call: short calls, a cancellation checkpoint between them


def _min_documents(entities: int) -> int:
    """The documents an entity must be mentioned in for its name to be embedded, in a graph this large.

    Large graphs compare the query with the names of the entities that connect documents; the long tail of
    entities mentioned by one document still links exactly and fuzzily.
    """
    return 1 if entities <= EMBED_ALL_ENTITIES_UP_TO else MIN_DOCUMENTS_TO_EMBED


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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


@dataclass
class EntityTable:
    """A collection's entities, aliases and name vectors, for a data version."""

    documents: int
    rows: list[EntityRow]
    row_of_id: dict[int, int]
    id_of_key: dict[str, int]
    ids_of_alias: dict[str, list[int]]
    keys: list[str]
    # Name vectors of the entities that are embedded (vector_rows[i] is the position in rows of vectors[i]).
    vector_rows: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]
    # What a later version is made from (KnowledgeGraphIndex._updated_entities): the data version read in
    # the snapshot it was read in, the documents the graph covered, the document count from which a name is
    # embedded, the storage `vectors` views.
    version: int = 0
    indexed: frozenset[str] = frozenset()
    min_documents: int = 1
    vector_column: Column | None = field(default=None, compare=False, repr=False)

    def specificity(self, entity_id: int) -> float:
        """How specific an entity is to few documents, in [0, 1] (normalised IDF)."""
        row = self.rows[self.row_of_id[entity_id]]
        return specificity(row.document_count, self.documents)


@dataclass(frozen=True, slots=True)
class _Component:
    """The largest connected component's size, with the relation count and data version it was computed at."""

    size: int
    relations: int
    version: int


def specificity(document_count: int, documents: int) -> float:
    """log((N + 1) / (df + 0.5)) / log(N + 2), clipped to [0, 1]: near 1 when rare, 0 when everywhere."""
    if documents <= 0:
        return 0.0
    value = math.log((documents + 1) / (document_count + 0.5)) / math.log(documents + 2)
    return min(1.0, max(0.0, value))


class KnowledgeGraphIndex:
    """TechniqueIndex of rag_graphrag: entities, mentions and weighted relations per collection."""

    name = "knowledge_graph"

    def __init__(self, settings: Settings, store: DocumentStore, embedder: TextEncoder) -> None:
        self.settings = settings
        self.store = store
        self.graph = store.technique_storage(KnowledgeGraphStorage)
        self.embedder = embedder
        self.rules = RuleExtractor()
        self.llm: LlmExtractor | None = (
            LlmExtractor(TechniqueLLM(settings)) if settings.llm_provider == "openai" else None
        )
        self._tables: VersionedCache[EntityTable] = VersionedCache()
        self._components: VersionedCache[_Component] = VersionedCache()

    @property
    def extractor_name(self) -> str:
        """The extractor new documents go through: "llm" when an LLM is configured, else "rules"."""
        return "llm" if self.llm is not None else "rules"

    # TechniqueIndex
    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> PreparedGraphs:
        """Extract entities and relations from each document, place each unit in its chunk, embed the names.

        Every name a mention gives is embedded here, outside the transaction, so that write() stores each
        new entity with its vector and no query ever embeds the graph.
        """
        prepared = PreparedGraphs()
        for document in documents:
            graph = self._extract(document)
            prepared.documents[document.id] = PreparedDocument(graph, _unit_chunks(graph.units, document))
        # A name's cached vector is owned by the first of these documents that mentions it.
        owners = {d.id: CacheOwner.of(collection_id, d) for d in documents}
        named = [(m.name, owners[i]) for i, item in prepared.documents.items() for m in item.graph.mentions]
        prepared.name_vectors = self.name_vectors([n for n, _ in named], [o for _, o in named])
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
        assert isinstance(prepared, PreparedGraphs)
        items = [(d, prepared.documents[d.id]) for d in documents if d.id in prepared.documents]
        resolve = self._resolve_abbreviations(collection_id, [p.graph for _, p in items])

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
        known = self.graph.ensure_entities(collection_id, names)
        ids = {entity.key: entity.id for entity in known}
        # New entities (and old ones stored before vectors were) get the vector of their stored name.
        self.graph.set_entity_vectors(
            [
                (e.id, prepared.name_vectors[e.name])
                for e in known
                if e.needs_vector and e.name in prepared.name_vectors
            ]
        )

        write = GraphWrite()
        mention_counts: Counter[int] = Counter()
        document_counts: Counter[int] = Counter()
        weights: Counter[tuple[int, int, str]] = Counter()
        evidence: dict[tuple[int, int, str], dict[str, list[Any]]] = defaultdict(dict)
        for document, item in items:
            graph = item.graph
            for mention in graph.mentions:
                entity = ids[resolve.get(mention.key, mention.key)]
                chunk = chunk_id(document.id, item.unit_chunks[mention.unit])
                write.mentions.append(
                    MentionRow(entity, document.id, chunk, mention.field, mention.start, mention.end)
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
                chunk = chunk_id(document.id, item.unit_chunks[relation.unit])
                slot = evidence[triple].setdefault(chunk, [document.id, 0, unit.field, unit.start, unit.end])
                slot[1] += 1
            for short, long in graph.aliases.items():
                if long in ids:
                    surface = graph.short_forms.get(short, short)
                    write.aliases.append(AliasRow(short, ids[long], document.id, surface))
            entity_count = len({m.key for m in graph.mentions})
            write.documents.append(
                GraphDocument(document.id, graph.extractor, entity_count, relation_count, graph.note)
            )

        write.counts = {e: (mention_counts[e], document_counts[e]) for e in mention_counts}
        write.relations = [
            NewRelation(
                *triple,
                weight,
                [NewEvidence(slot[0], chunk, *slot[1:]) for chunk, slot in evidence[triple].items()],
            )
            for triple, weight in weights.items()
        ]
        self.graph.add(collection_id, write)
        self._touch(collection_id)

    def _resolve_abbreviations(self, collection_id: str, graphs: list[DocumentGraph]) -> dict[str, str]:
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
        for alias, key, count in self.graph.alias_votes(collection_id, sorted(wanted)):
            votes[alias][key] += count
        return {
            short: min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0] for short, counter in votes.items()
        }

    def delete(self, collection_id: str, document_id: str) -> None:
        """Drop a document's mentions and evidence, subtract its counts from the weights, drop empty rows."""
        if self.graph.delete_document(collection_id, document_id):
            self._touch(collection_id)

    def _touch(self, collection_id: str) -> None:
        """Bump the graph's version and record which extractor(s) built it."""
        by_extractor = self.graph.extractor_counts(collection_id)
        extractor = (
            next(iter(by_extractor)) if len(by_extractor) == 1 else "mixed" if by_extractor else "none"
        )
        model = self.llm.model_name if self.llm is not None and "llm" in by_extractor else None
        self.graph.record(collection_id, extractor, model, _now())

    def stats(self) -> dict[str, Any]:
        """Per collection: documents, entities, mentions, relations, extractor and the largest component."""
        collections: dict[str, Any] = {}
        for collection_id, record in self.graph.collections():
            collections[collection_id] = {
                "extractor": record.extractor,
                **({"llm_model": record.llm_model} if record.llm_model else {}),
                **(counts := self.graph.counts(collection_id)),
                "largest_component": self.largest_component(
                    collection_id, record.version, counts["relations"]
                ),
                "extractors": self.extractor_counts(collection_id),
            }
        return {"collections": collections}

    def largest_component(self, collection_id: str, version: int, relations: int) -> int:
        """Entities in the largest connected component of the graph of this data version and `relations`.

        A statistic for health details, computed over every relation (about 0.4 s at SciFact's 700K): kept,
        as the keyword vocabulary is (retrieval/vocabulary.py), while the relations stay within its
        STALE_SHARE of the count it was computed at, for fewer than its MAX_VERSIONS writes.
        """

        def build() -> _Component:
            entities = self.graph.entity_count(collection_id)
            size = largest_component(self.graph.relation_ends(collection_id), entities)
            return _Component(size, relations, version)

        def update(_: int, held: _Component) -> _Component | None:
            return held if vocabulary.still_close(held.relations, held.version, relations, version) else None

        return self._components.get(collection_id, version, build, update).size

    def drop_collection(self, collection_id: str) -> None:
        """The collection is going: its whole graph and record go too (CollectionState)."""
        self.graph.drop_collection(collection_id)

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents the graph covers."""
        return self.graph.indexed_documents(collection_id)

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents the graph covers."""
        return self.graph.indexed_document_ids(collection_id)

    # Query side
    def collection_info(self, collection_id: str) -> dict[str, Any]:
        """The collection's graph record: extractor, LLM model, version, update time."""
        record = self.graph.graph_record(collection_id)
        if record is None:
            return {"extractor": "none", "llm_model": None, "version": 0, "updated_at": None}
        return {
            "extractor": record.extractor,
            "llm_model": record.llm_model,
            "version": record.version,
            "updated_at": record.updated_at,
        }

    def extractor_counts(self, collection_id: str) -> dict[str, int]:
        """How many documents each extractor read (llm, rules, rules_fallback)."""
        return self.graph.extractor_counts(collection_id)

    def entity_table(self, collection_id: str, version: int) -> EntityTable:
        """The collection's entities with their name vectors for this data version (read before) or newer.

        Loaded whole once; after writes that only added documents to the graph, brought up to date from the
        entities those documents mention. A document the held table covers written again or deleted may
        have taken entities, counts or aliases away: then the table is loaded again.
        """
        return self._tables.get(
            collection_id,
            version,
            lambda: self._load_entities(collection_id),
            lambda _, table: self._updated_entities(collection_id, table),
        )

    def _load_entities(self, collection_id: str) -> EntityTable:
        with self.store.read_snapshot():  # the documents covered and the counts they add up to agree
            version = self.store.data_version(collection_id)
            indexed = frozenset(self.graph.indexed_document_ids(collection_id))
            min_documents = _min_documents(self.graph.entity_count(collection_id))
            stored = self.graph.entities(collection_id, min_documents)
            aliases: dict[str, list[int]] = defaultdict(list)
            for alias, entity_id in self.graph.entity_aliases(collection_id):
                aliases[alias].append(entity_id)
        rows = [entity.row for entity in stored]
        embedded = [i for i, entity in enumerate(stored) if entity.wanted]
        return EntityTable(
            documents=len(indexed),
            rows=rows,
            row_of_id={r.id: i for i, r in enumerate(rows)},
            id_of_key={r.key: r.id for r in rows},
            ids_of_alias=dict(aliases),
            keys=[r.key for r in rows],
            vector_rows=np.array(embedded, dtype=np.int64),
            vectors=self._stored_vectors(
                collection_id, [rows[i].name for i in embedded], [stored[i].vector for i in embedded]
            ),
            version=version,
            indexed=indexed,
            min_documents=min_documents,
        )

    def _updated_entities(self, collection_id: str, table: EntityTable) -> EntityTable | None:
        """The table brought to the version the database holds now; None when it must be loaded again.

        Only documents the table did not cover may have changed (rows are re-read whole, so a document
        indexed and removed again in between leaves nothing behind); the rows of the entities they mention
        now are read again, new entities appended (a fresh load orders by id: a new id below the last one
        reloads), and names mentioned in enough documents only now embedded.
        """
        with self.store.read_snapshot():
            version = self.store.data_version(collection_id)
            limit = update_limit(table.documents)
            documents = self.store.changed_documents(collection_id, table.version, version, limit)
            if documents is None or not table.indexed.isdisjoint(documents):
                return None
            indexed = frozenset(self.graph.indexed_document_ids(collection_id))
            graphed = documents & indexed  # the others have no graph yet (an ingest before its build)
            stored = self.graph.entities(collection_id, table.min_documents, graphed) if graphed else []
            aliases = self.graph.entity_aliases(collection_id, graphed) if graphed else []
        if not graphed:  # nothing to read: the same rows, under the new version
            return replace(table, documents=len(indexed), indexed=indexed, version=version)
        new = [entity for entity in stored if entity.row.id not in table.row_of_id]
        if (new and table.rows and new[0].row.id < table.rows[-1].id) or _min_documents(
            len(table.rows) + len(new)
        ) != table.min_documents:
            return None
        rows = list(table.rows)
        row_of_id = dict(table.row_of_id)
        to_embed: list[tuple[int, StoredEntity]] = []
        for entity in stored:
            place = row_of_id.get(entity.row.id)
            embedded = place is not None and rows[place].document_count >= table.min_documents
            if place is None:
                place = row_of_id[entity.row.id] = len(rows)
                rows.append(entity.row)
            else:
                rows[place] = entity.row
            if entity.wanted and not embedded:
                to_embed.append((place, entity))
        ids_of_alias = dict(table.ids_of_alias)
        for alias, entity_id in aliases:
            known = ids_of_alias.get(alias, [])
            if entity_id not in known:
                ids_of_alias[alias] = [*known, entity_id]
        column = table.vector_column if table.vector_column is not None else Column(table.vectors)
        fresh = self._stored_vectors(
            collection_id, [e.row.name for _, e in to_embed], [e.vector for _, e in to_embed]
        )
        column, vectors = column.extended(len(table.vectors), fresh)
        return EntityTable(
            documents=len(indexed),
            rows=rows,
            row_of_id=row_of_id,
            id_of_key={**table.id_of_key, **{e.row.key: e.row.id for e in new}},
            ids_of_alias=ids_of_alias,
            keys=[*table.keys, *(e.row.key for e in new)],
            vector_rows=np.concatenate(
                [table.vector_rows, np.array([place for place, _ in to_embed], dtype=np.int64)]
            ),
            vectors=vectors,
            version=version,
            indexed=indexed,
            min_documents=table.min_documents,
            vector_column=column,
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
        fresh = self.name_vectors(missing, [None] * len(missing))  # owned by no document: kept
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

    def name_vectors(
        self, names: list[str], owners: list[CacheOwner | None]
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Each distinct name's vector: from the store's embedding cache, else encoded (and cached).

        `owners`: each name's document, which owns its cached vector (the first, for a name repeated).
        """
        owner_of: dict[str, CacheOwner | None] = {}
        for name, owner in zip(names, owners, strict=True):
            owner_of.setdefault(name, owner)
        if not owner_of:
            return {}
        model = self.settings.embedding_model_id
        hashes = {cache_key(n): n for n in owner_of}
        cached = self.store.cached_embeddings(model, list(hashes))
        vectors = {hashes[h]: vector for h, vector in cached.items()}
        fresh = [(h, n) for h, n in hashes.items() if h not in cached]
        for batch in _batches(fresh, NAME_ENCODE_BATCH):
            check_cancelled()  # between encoder calls: a cancelled ingest stops here
            encoded = self.embedder.encode([n for _, n in batch], batch_size=256)
            items: list[CacheItem] = [(h, encoded[i], owner_of[n]) for i, (h, n) in enumerate(batch)]
            self.store.cache_embeddings(model, items)
            vectors.update({n: encoded[i] for i, (_, n) in enumerate(batch)})
        return vectors

    def relations_of(self, collection_id: str, entity_ids: Iterable[int]) -> list[RelationRow]:
        """Every relation with one of the entities at either end."""
        return self.graph.relations_of(collection_id, list(entity_ids))

    def evidence_of(self, relation_ids: Iterable[int]) -> list[EvidenceRow]:
        """Every evidence row of the relations."""
        return self.graph.evidence_of(list(relation_ids))

    def mentions_of(self, entity_ids: Iterable[int]) -> list[MentionRow]:
        """Every mention of the entities."""
        return self.graph.mentions_of(list(entity_ids))

    def aliases_of(self, entity_id: int) -> list[str]:
        """The abbreviations that stand for an entity, as written."""
        return self.graph.aliases_of(entity_id)


def largest_component(edges: list[tuple[int, int]], entities: int) -> int:
    """Entities in the largest connected component of a graph's edges (an entity without any: 1).

    scipy's connected components, in C: a union-find in Python took 0.7 s over SciFact's 700K relations.
    """
    if not edges:
        return 1 if entities else 0
    ids, ends = np.unique(np.asarray(edges, dtype=np.int64), return_inverse=True)
    ends = ends.reshape(-1, 2)
    graph = coo_matrix((np.ones(len(ends), dtype=np.int8), (ends[:, 0], ends[:, 1])), shape=(len(ids),) * 2)
    _, labels = connected_components(graph, directed=False)
    return int(np.bincount(labels).max())


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
