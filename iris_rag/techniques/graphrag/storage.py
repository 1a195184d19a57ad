"""What rag_graphrag stores, as a contract each store backend implements (backends/<backend>/graphrag.py).

Per collection: entities (key, name, type, mention and document counts, the name's vector), abbreviation
aliases, mentions, weighted relations with their evidence, the documents the graph covers, and a record of
which extractor built it. Ids of entities and relations are the backend's integers. Writes join the store's
open ingest transaction; delete_document keeps every count and weight in step (see KnowledgeGraphIndex).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class EntityRow:
    """An entity as the query side sees it."""

    id: int
    key: str
    name: str
    type: str
    mention_count: int
    document_count: int


@dataclass(frozen=True, slots=True)
class StoredEntity:
    """An entity with its stored name vector (float32 bytes), when asked for and present."""

    row: EntityRow
    vector: bytes | None
    wanted: bool  # whether its vector was asked for (document_count >= the caller's minimum)


@dataclass(frozen=True, slots=True)
class EntityKey:
    """An entity as the write side needs it: its id, and whether it still lacks a name vector."""

    id: int
    key: str
    name: str
    needs_vector: bool


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


@dataclass(frozen=True, slots=True)
class NewEvidence:
    """One chunk's statement of a relation being written (its relation id is the backend's to find)."""

    document_id: str
    chunk_id: str
    count: int
    field: str
    start_char: int
    end_char: int


@dataclass(frozen=True, slots=True)
class NewRelation:
    """Weight to add to a (source, target, type) relation, created if absent, and its new evidence."""

    source_id: int
    target_id: int
    type: str
    weight: int
    evidence: list[NewEvidence]


@dataclass(frozen=True, slots=True)
class AliasRow:
    """An abbreviation a document defines for an entity, as written there."""

    alias: str
    entity_id: int
    document_id: str
    surface: str


@dataclass(frozen=True, slots=True)
class GraphDocument:
    """A document the graph covers: which extractor read it and what it gave."""

    document_id: str
    extractor: str
    entities: int
    relations: int
    note: str | None


@dataclass
class GraphWrite:
    """Everything an ingest batch adds to a collection's graph, after its entities exist."""

    mentions: list[MentionRow] = field(default_factory=list)
    # entity id -> (mentions added, documents added)
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)
    relations: list[NewRelation] = field(default_factory=list)
    aliases: list[AliasRow] = field(default_factory=list)
    documents: list[GraphDocument] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class GraphRecord:
    """A collection's graph record."""

    extractor: str
    llm_model: str | None
    version: int
    updated_at: str | None


class KnowledgeGraphStorage(Protocol):
    """The knowledge graph's rows."""

    # Write side (inside the ingest or delete transaction)
    def alias_votes(self, collection_id: str, aliases: list[str]) -> list[tuple[str, str, int]]:
        """(alias, entity key, how many documents define it so) for the given aliases."""

    def ensure_entities(self, collection_id: str, entities: dict[str, tuple[str, str]]) -> list[EntityKey]:
        """Create the entities (key -> (name, type)) that are absent; every asked entity with its id."""

    def set_entity_vectors(self, vectors: list[tuple[int, npt.NDArray[np.float32]]]) -> None:
        """Store entities' name vectors."""

    def add(self, collection_id: str, write: GraphWrite) -> None:
        """Add mentions, counts, relation weights with their evidence, aliases and documents."""

    def delete_document(self, collection_id: str, document_id: str) -> bool:
        """Take a document out of the graph; False if the graph does not cover it.

        Its mentions, evidence and aliases go with the counts and weights they gave; entities left
        unmentioned and relations left without weight go too.
        """

    def drop_collection(self, collection_id: str) -> None:
        """Remove every row of the collection's graph, its record included."""

    def extractor_counts(self, collection_id: str) -> dict[str, int]:
        """How many documents each extractor read."""

    def record(self, collection_id: str, extractor: str, llm_model: str | None, updated_at: str) -> None:
        """Record which extractor built the graph, and move its version on (llm_model kept if None)."""

    # Read side
    def graph_record(self, collection_id: str) -> GraphRecord | None:
        """The collection's graph record, or None."""

    def collections(self) -> list[tuple[str, GraphRecord]]:
        """Every collection with a graph, its record's version being the collection's data version."""

    def counts(self, collection_id: str) -> dict[str, int]:
        """documents, entities, mentions and relations of the collection's graph."""

    def entity_count(self, collection_id: str) -> int:
        """The collection's entities (one count: counts() also counts every mention and relation)."""

    def indexed_documents(self, collection_id: str) -> int:
        """How many documents the graph covers."""

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the documents the graph covers."""

    def entities(
        self, collection_id: str, min_documents: int, mentioned_by: set[str] | None = None
    ) -> list[StoredEntity]:
        """Every entity (or those the documents mention) by id; vectors of those in min_documents or more."""

    def entity_aliases(
        self, collection_id: str, document_ids: set[str] | None = None
    ) -> list[tuple[str, int]]:
        """Every distinct (alias, entity id) of the collection (or of these documents' alias rows)."""

    def alias_rows(self, collection_id: str) -> list[AliasRow]:
        """Every alias row of the collection as written (`iris-rag migrate` copies them)."""

    def graph_documents(self, collection_id: str) -> list[GraphDocument]:
        """Every document the graph covers, by document id (`iris-rag migrate` copies them)."""

    def relation_ends(self, collection_id: str) -> list[tuple[int, int]]:
        """(source id, target id) of every relation."""

    def relations_of(self, collection_id: str, entity_ids: list[int]) -> list[RelationRow]:
        """Every relation with one of the entities at either end."""

    def evidence_of(self, relation_ids: list[int]) -> list[EvidenceRow]:
        """Every evidence row of the relations."""

    def mentions_of(self, entity_ids: list[int]) -> list[MentionRow]:
        """Every mention of the entities."""

    def aliases_of(self, entity_id: int) -> list[str]:
        """The abbreviations written for an entity, sorted."""
