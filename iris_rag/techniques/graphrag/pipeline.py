"""GraphRAG: link the query to the collection's knowledge graph, walk it, and rank chunks by vector + path.

Retrieval, step by step:
1. Link: the query's phrases (found by the same rule extractor that reads documents) are matched to entities
   exactly (normalised key or a defined abbreviation), fuzzily (rapidfuzz ratio of the keys) and by the
   cosine of their embeddings with the entity names' (embedded at ingest, loaded once per data version).
   Fuzzy and embedding matches must reach entity_threshold. A linked entity starts with score
   confidence * specificity (normalised IDF of the documents mentioning it).
2. Walk (up to max_hops): the chunks that mention a linked entity are reached at hop 0. At each
   hop the relations of the frontier entities are loaded into an adjacency map; the edge u -> v carries the
   path on with score(u) * strength(u, v) * specificity(v), where strength is log(1 + weight(u, v)) over
   log(1 + the strongest weight at u); the chunks that evidence that relation are reached at this hop.
   A chunk's graph score combines its best path per linked entity as a noisy-OR: 1 - prod(1 - path score).
3. Rank: the dense top candidates and every reached chunk are scored
   (1 - relationship_weight) * cosine + relationship_weight * graph score.
"""

from __future__ import annotations

import copy
import heapq
import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field
from rapidfuzz import fuzz, process

from iris_rag.cancellation import check_cancelled
from iris_rag.pipeline import Pipeline, PipelineContext, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.stores.base import CollectionInfo, cache_key
from iris_rag.stores.filters import parse_filters
from iris_rag.stores.technique_index import TechniqueIndex
from iris_rag.techniques.graphrag.extraction import GENERIC, STOPWORDS, RuleExtractor, entity_key
from iris_rag.techniques.graphrag.index import EntityTable, KnowledgeGraphIndex
from iris_rag.techniques.graphrag.storage import EntityRow, RelationRow
from iris_rag.validation import validate_arguments

CANDIDATE_POOL = 100  # dense candidates, besides the chunks the graph reaches
MAX_LINKED_ENTITIES = 20
MATCHES_PER_PHRASE = 3  # fuzzy and embedding matches kept per query phrase
EDGE_BEAM = 200  # relations followed per hop, the strongest paths first
FRONTIER = 25  # entities carried on to the next hop
MIN_PATH_SCORE = 0.005
PATHS_PER_DOCUMENT = 3
SNIPPET_CHARS = 300

Vector = npt.NDArray[np.float32]


class GraphRagParams(BaseModel):
    """technique_params of rag_graphrag (schema: schemas/tools/rag_graphrag.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_hops: int = Field(2, ge=1, le=5)
    entity_threshold: float = Field(0.7, ge=0, le=1)
    relationship_weight: float = Field(0.5, ge=0, le=1)
    include_entity_context: bool = True


@dataclass(frozen=True, slots=True)
class LinkedEntity:
    """A query phrase matched to an entity of the graph."""

    entity: EntityRow
    method: str  # exact, alias, fuzzy, embedding
    confidence: float
    query_text: str
    specificity: float

    @property
    def start_score(self) -> float:
        """Where the entity's paths start: how sure the link is, times how specific the entity is."""
        return self.confidence * self.specificity

    def as_dict(self) -> dict[str, Any]:
        """The wire shape."""
        return {
            "name": self.entity.name,
            "type": self.entity.type,
            "match": self.method,
            "confidence": round(self.confidence, 4),
            "query_text": self.query_text,
            "specificity": round(self.specificity, 4),
            "document_count": self.entity.document_count,
        }


@dataclass(frozen=True, slots=True)
class Reach:
    """How a chunk (or an entity) was reached from one linked entity: the path and its score."""

    score: float
    hop: int
    entities: tuple[int, ...]
    relations: tuple[RelationRow, ...] = ()


@dataclass(slots=True)
class Edge:
    """One entity pair of the walked graph: its weight (summed over relation types) and its relations."""

    weight: float
    relations: list[RelationRow]


@dataclass
class Walk:
    """What the graph walk reached."""

    chunks: dict[str, dict[int, Reach]] = field(default_factory=lambda: defaultdict(dict))
    entities_by_hop: list[int] = field(default_factory=list)
    relations_by_hop: list[int] = field(default_factory=list)
    # The relations loaded so far, undirected: graph[u][v] is graph[v][u], the same Edge. Plain dicts: a
    # networkx Graph cost 8 us an edge to build, and a SciFact call loads thousands (docs/benchmarks.md).
    graph: dict[int, dict[int, Edge]] = field(default_factory=lambda: defaultdict(dict))

    def add_relation(self, relation: RelationRow) -> None:
        """One edge per entity pair, its weight the sum over the pair's relation types (as _add_relation)."""
        u, v = relation.source_id, relation.target_id
        edge = self.graph[u].get(v)
        if edge is None:
            edge = Edge(relation.weight, [relation])
            self.graph[u][v] = edge
            self.graph[v][u] = edge
        elif all(r.id != relation.id for r in edge.relations):
            edge.relations.append(relation)
            edge.weight += relation.weight

    def reach(self, chunk_id: str, start: int, reach: Reach) -> None:
        """Keep the best path from each linked entity to the chunk."""
        current = self.chunks[chunk_id].get(start)
        if current is None or reach.score > current.score:
            self.chunks[chunk_id][start] = reach

    def graph_score(self, chunk_id: str) -> float:
        """Noisy-OR of the best path scores from each linked entity."""
        miss = 1.0
        for reach in self.chunks.get(chunk_id, {}).values():
            miss *= 1.0 - min(reach.score, 1.0)
        return 1.0 - miss


_DIGITS = re.compile(r"\d+")
_CERTAIN = ("exact", "alias")


def query_phrases(query: str) -> list[str]:
    """The query's entity-like phrases, as the rule extractor finds them in documents."""
    graph = RuleExtractor().extract("", query)
    return list(dict.fromkeys(query[m.start : m.end] for m in graph.mentions))


def _sub_phrases(phrase: str) -> list[str]:
    """The phrase and every contiguous run of its words that is not only generic words."""
    words = phrase.split()
    subs = []
    for length in range(len(words), 0, -1):
        for start in range(len(words) - length + 1):
            part = words[start : start + length]
            if all(w.lower() in GENERIC or w.lower() in STOPWORDS for w in part):
                continue
            subs.append(" ".join(part))
    return subs


class FuzzyKeys:
    """A bound that rules out most entity keys before rapidfuzz scores them, without changing any match.

    fuzz.ratio is 100 * (1 - indel / (len(a) + len(b))), and the indel distance is at least
    len(a) + len(b) - 2 * the characters the two have in common (as a multiset). So a key whose common
    characters give a bound below the cutoff cannot reach it, and is left out; the rest are scored by
    rapidfuzz, in their original order, so ties come out as before. On a third of SciFact (42,000 keys)
    rapidfuzz over every key took 8 ms a phrase.
    """

    COLUMNS = 47  # the most common characters each get a count; the rest share one (the bound stays valid)

    def __init__(self, keys: list[str], column: dict[str, int] | None = None) -> None:
        self.keys = keys
        self.lengths = np.array([len(key) for key in keys], dtype=np.int64)
        # Every key's characters as code points, in one array; counted with bincount, no Python loop.
        codes = np.frombuffer("".join(keys).encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        if column is None:
            frequency = np.bincount(codes) if len(codes) else np.zeros(1, dtype=np.int64)
            present = np.flatnonzero(frequency)
            common = present[np.argsort(-frequency[present], kind="stable")][: self.COLUMNS]
            column = {chr(int(code)): place for place, code in enumerate(common)}
        self.column = column
        column_of = np.full(int(codes.max(initial=0)) + 1, self.COLUMNS, dtype=np.int64)
        for char, place in column.items():
            if ord(char) < len(column_of):
                column_of[ord(char)] = place
        rows = np.repeat(np.arange(len(keys)), self.lengths)
        counts = np.bincount(column_of[codes] * len(keys) + rows, minlength=(self.COLUMNS + 1) * len(keys))
        # A column per character (a query touches only its own few); counts over 255 are clipped, which
        # is exact for a query key of at most 255 characters (longer ones are scored without the bound).
        self.counts = np.minimum(counts, 255).astype(np.uint8).reshape(self.COLUMNS + 1, len(keys))

    def extended(self, keys: list[str]) -> FuzzyKeys:
        """The bound over `keys`, which begin with this one's: only the new keys are counted.

        They are counted in this one's character columns: the bound holds whichever characters get a
        column of their own, so the matches stay those of a bound built over all the keys at once.
        """
        more = FuzzyKeys(keys[len(self.keys) :], self.column)
        grown = copy.copy(self)
        grown.keys = keys
        grown.lengths = np.concatenate([self.lengths, more.lengths])
        grown.counts = np.concatenate([self.counts, more.counts], axis=1)
        return grown

    def extract(self, key: str, cutoff: float, limit: int) -> list[tuple[str, float, int]]:
        """process.extract(key, keys, scorer=fuzz.ratio, score_cutoff=cutoff, limit=limit), the same list."""
        if not self.keys:
            return []
        if len(key) > 255:
            return process.extract(key, self.keys, scorer=fuzz.ratio, score_cutoff=cutoff, limit=limit)
        histogram: dict[int, int] = defaultdict(int)
        for char in key:
            histogram[self.column.get(char, self.COLUMNS)] += 1
        shared = np.zeros(len(self.keys), dtype=np.int16)  # at most 255 characters: no overflow
        for column, count in histogram.items():
            shared += np.minimum(self.counts[column], count)
        bound = 200.0 * shared / np.maximum(self.lengths + len(key), 1)
        positions = np.flatnonzero(bound >= cutoff - 1e-6)
        found = process.extract(
            key, [self.keys[i] for i in positions], scorer=fuzz.ratio, score_cutoff=cutoff, limit=limit
        )
        return [(candidate, score, int(positions[index])) for candidate, score, index in found]


def link_entities(
    phrases: list[str],
    phrase_vectors: npt.NDArray[np.float32],
    table: EntityTable,
    threshold: float,
    fuzzy: FuzzyKeys | None = None,
) -> list[LinkedEntity]:
    """Match the query's phrases to entities: exactly, then fuzzily and by name embedding (>= threshold).

    `fuzzy`: the table's FuzzyKeys, kept by the caller across calls (built here when not given).
    """
    if not table.rows:
        return []
    best: dict[int, LinkedEntity] = {}

    def offer(entity_id: int, method: str, confidence: float, text: str) -> None:
        row = table.rows[table.row_of_id[entity_id]]
        link = LinkedEntity(row, method, confidence, text, table.specificity(entity_id))
        current = best.get(entity_id)
        # An exact name or a defined abbreviation is certain: no fuzzy or embedding match replaces it.
        if current is None or (current.method not in _CERTAIN and link.confidence > current.confidence):
            best[entity_id] = link

    unmatched: list[tuple[str, str]] = []
    for phrase in phrases:
        matched = False
        for sub in _sub_phrases(phrase):
            key = entity_key(sub)
            if not key:
                continue
            if key in table.id_of_key:
                offer(table.id_of_key[key], "exact", 1.0, sub)
                matched = matched or sub == phrase
            for entity_id in table.ids_of_alias.get(key, []):
                offer(entity_id, "alias", 1.0, sub)
                matched = matched or sub == phrase
        key = entity_key(phrase)
        if not matched and len(key) >= 4:
            unmatched.append((phrase, key))
    if unmatched and fuzzy is None:
        fuzzy = FuzzyKeys(table.keys)
    for phrase, key in unmatched:
        assert fuzzy is not None
        digits = _DIGITS.findall(key)
        for candidate, score, position in fuzzy.extract(key, threshold * 100, MATCHES_PER_PHRASE * 3):
            # BRCA1 is not BRCA2: a fuzzy match must keep the numbers.
            if _DIGITS.findall(candidate) == digits and candidate != key:
                offer(table.rows[position].id, "fuzzy", score / 100, phrase)
    if phrases and len(table.vectors):
        similarities = table.vectors @ phrase_vectors.T
        for column, phrase in enumerate(phrases):
            scores = similarities[:, column]
            # The best MATCHES_PER_PHRASE without sorting every name (argsort was 3 ms a call on SciFact).
            if len(scores) > MATCHES_PER_PHRASE:
                best_few = np.argpartition(-scores, MATCHES_PER_PHRASE - 1)[:MATCHES_PER_PHRASE]
            else:
                best_few = np.arange(len(scores))
            top = best_few[np.argsort(-scores[best_few], kind="stable")]
            for position in top:
                if scores[position] >= threshold:
                    row = table.rows[int(table.vector_rows[position])]
                    offer(row.id, "embedding", float(scores[position]), phrase)
    ranked = sorted(best.values(), key=lambda link: (-link.confidence, -link.specificity, link.entity.id))
    return ranked[:MAX_LINKED_ENTITIES]


def walk_graph(
    index: KnowledgeGraphIndex,
    collection_id: str,
    table: EntityTable,
    linked: list[LinkedEntity],
    max_hops: int,
    allowed: set[str] | None,
) -> Walk:
    """Reach chunks from the linked entities: mentions (hop 0), then the evidence of the relations walked."""
    walk = Walk()
    starts = {link.entity.id: link.start_score for link in linked}
    for mention in index.mentions_of(starts):
        if allowed is None or mention.document_id in allowed:
            walk.reach(
                mention.chunk_id, mention.entity_id, Reach(starts[mention.entity_id], 0, (mention.entity_id,))
            )
    walk.entities_by_hop.append(len(starts))
    graph = walk.graph
    specificity: dict[int, float] = {}
    frontier = {entity: Reach(score, 0, (entity,)) for entity, score in starts.items() if score > 0}
    visited = set(frontier)
    expanded: set[int] = set()
    for hop in range(1, max_hops + 1):
        check_cancelled()  # each hop loads relations and evidence: stop here once the call is cancelled
        if not frontier:
            break
        for relation in index.relations_of(collection_id, [u for u in frontier if u not in expanded]):
            walk.add_relation(relation)
        expanded.update(frontier)
        # Every way on from the frontier, scored; the strongest EDGE_BEAM are followed.
        candidates: list[tuple[float, int, int]] = []
        for u, reach in frontier.items():
            neighbours = graph.get(u)
            if not neighbours:
                continue
            strongest = math.log1p(max(edge.weight for edge in neighbours.values()))
            for v, edge in neighbours.items():
                if v in reach.entities or v not in table.row_of_id:
                    continue
                known = specificity.get(v)
                if known is None:  # an entity reached from several frontier entities is computed once
                    known = specificity[v] = table.specificity(v)
                score = reach.score * (math.log1p(edge.weight) / strongest) * known
                if score >= MIN_PATH_SCORE:
                    candidates.append((score, u, v))
        candidates = heapq.nsmallest(EDGE_BEAM, candidates, key=lambda c: (-c[0], c[1], c[2]))
        evidence = defaultdict(list)
        relation_ids = [r.id for _, u, v in candidates for r in graph[u][v].relations]
        for row in index.evidence_of(relation_ids):
            if allowed is None or row.document_id in allowed:
                evidence[row.relation_id].append(row)
        next_frontier: dict[int, Reach] = {}
        followed = 0
        for score, u, v in candidates:
            reach = frontier[u]
            start = reach.entities[0]
            for relation in graph[u][v].relations:
                rows = evidence.get(relation.id)
                if not rows:
                    continue  # no evidence the filter lets through
                followed += 1
                step = Reach(score, hop, (*reach.entities, v), (*reach.relations, relation))
                for row in rows:
                    walk.reach(row.chunk_id, start, step)
                if v not in visited and (v not in next_frontier or next_frontier[v].score < score):
                    next_frontier[v] = step
        walk.relations_by_hop.append(followed)
        frontier = dict(sorted(next_frontier.items(), key=lambda kv: (-kv[1].score, kv[0]))[:FRONTIER])
        visited.update(frontier)
        walk.entities_by_hop.append(len(frontier))
    return walk


def _add_relation(graph: nx.Graph, relation: RelationRow) -> None:
    """One edge per entity pair, its weight the sum over the pair's relation types."""
    if graph.has_edge(relation.source_id, relation.target_id):
        data = graph.edges[relation.source_id, relation.target_id]
        if all(r.id != relation.id for r in data["relations"]):
            data["relations"].append(relation)
            data["weight"] += relation.weight
    else:
        graph.add_edge(relation.source_id, relation.target_id, weight=relation.weight, relations=[relation])


class GraphRagPipeline(Pipeline):
    """Entity linking, a weighted multi-hop walk of the knowledge graph, and vector similarity, mixed."""

    technique = "graphrag"
    params_model = GraphRagParams

    def __init__(self, context: PipelineContext) -> None:
        super().__init__(context)
        self.index = KnowledgeGraphIndex(context.settings, context.store, context.embedder)
        self._fuzzy: tuple[EntityTable, FuzzyKeys] | None = None

    def technique_index(self) -> TechniqueIndex | None:
        """The knowledge graph, built at ingest."""
        return self.index

    def extra_methods(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """rag_graph_explore's bridge method."""
        return {"graph_explore": self.graph_explore}

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: GraphRagParams
    ) -> Retrieval:
        """Link, walk, and rank the dense candidates and the reached chunks by the mixed score."""
        self.require_index(collection)
        store = self.context.store
        metadata_filter = parse_filters(options.filters)
        allowed = store.matching_document_ids(collection.id, metadata_filter) if metadata_filter else None
        table = self.index.entity_table(collection.id, collection.version)
        phrases = query_phrases(query)
        query_vector, phrase_vectors = self._encode(query, phrases)
        check_cancelled()
        linked = link_entities(
            phrases, phrase_vectors, table, params.entity_threshold, self._fuzzy_keys(table)
        )
        walk = walk_graph(self.index, collection.id, table, linked, params.max_hops, allowed)
        check_cancelled()

        pool = max(options.top_k, CANDIDATE_POOL)
        dense_hits = store.vector_search(collection.id, query_vector, pool, metadata_filter)
        dense = {hit.chunk_id: hit.score for hit in dense_hits}
        dense.update(
            store.vector_scores(collection.id, query_vector, [c for c in walk.chunks if c not in dense])
        )

        weight = params.relationship_weight
        scored = sorted(
            (
                ((1 - weight) * cosine + weight * walk.graph_score(chunk_id), chunk_id)
                for chunk_id, cosine in dense.items()
            ),
            key=lambda item: (-item[0], item[1]),
        )[: options.top_k]
        chunks = {c.chunk_id: c for c in store.get_chunks(collection.id, [c for _, c in scored])}
        names = _Names(table)
        documents = []
        for score, chunk_id in scored:
            if chunk_id not in chunks:
                continue
            reaches = sorted(walk.chunks.get(chunk_id, {}).values(), key=lambda r: -r.score)
            details: dict[str, Any] = {
                "vector_score": round(dense[chunk_id], 6),
                "graph_score": round(walk.graph_score(chunk_id), 6),
                "final_score": round(score, 6),
                "hop": reaches[0].hop if reaches else None,
            }
            if params.include_entity_context and reaches:
                details["paths"] = [_path(r, names) for r in reaches[:PATHS_PER_DOCUMENT]]
            documents.append(RetrievedDocument(chunks[chunk_id], score, details))

        info = self.index.collection_info(collection.id)
        specific: dict[str, Any] = {
            "extractor": info["extractor"],
            "extractors": self.index.extractor_counts(collection.id),
            **({"llm_model": info["llm_model"]} if info["llm_model"] else {}),
            "max_hops": params.max_hops,
            "entity_threshold": params.entity_threshold,
            "relationship_weight": weight,
            "linked_entity_count": len(linked),
            "entities_by_hop": walk.entities_by_hop,
            "relations_followed_by_hop": walk.relations_by_hop,
            "graph_chunks": len(walk.chunks),
            "dense_candidates": len(dense_hits),
            "graph_entities": len(table.rows),
            "used_chunk_ids": [d.chunk.chunk_id for d in documents],
        }
        if params.include_entity_context:
            specific["entity_context"] = {
                "linked_entities": [link.as_dict() for link in linked],
                "document_paths": {
                    d.chunk.document_id: d.details["paths"] for d in documents if "paths" in d.details
                },
            }
        return Retrieval(
            documents=documents,
            documents_searched=store.chunk_count(collection.id),
            technique_specific=specific,
        )

    def _fuzzy_keys(self, table: EntityTable) -> FuzzyKeys:
        """The table's FuzzyKeys, built once per entity table (a new data version loads a new table)."""
        kept = self._fuzzy
        if kept is not None and kept[0] is table:
            return kept[1]
        held = len(kept[0].keys) if kept is not None else -1
        if kept is not None and len(table.keys) >= held and table.keys[:held] == kept[0].keys:
            fuzzy = kept[1].extended(table.keys)  # a table brought up to date appends its new entities
        else:
            fuzzy = FuzzyKeys(table.keys)
        self._fuzzy = (table, fuzzy)
        return fuzzy

    def _encode(self, query: str, phrases: list[str]) -> tuple[Vector, npt.NDArray[np.float32]]:
        """The query's vector (as a query) and its phrases' (one batch), side by side on two threads.

        The query's is the vector the extractive answer's relevance check then finds remembered. One
        batch of the query and its phrases made the answer encode the query a second time, and its p95
        was 1.8 times this one's; each phrase as a query of its own was no faster than this (two
        same-run comparisons on the loaded 2-core VM: docs/benchmarks.md, "Where rag_basic's time goes").
        A phrase the ingest already embedded (every mention's name is, by the same encode) is read from
        the store's embedding cache instead, the same vector to the bit; on SciFact about half are.
        """
        embedder = self.context.embedder
        query_vector = embedder.encode_query_async(query)
        vectors = np.zeros((len(phrases), embedder.dimension), dtype=np.float32)
        if phrases:
            hashes = [cache_key(phrase) for phrase in phrases]
            cached = self.context.store.cached_embeddings(self.context.settings.embedding_model_id, hashes)
            missing = [i for i, h in enumerate(hashes) if h not in cached]
            for i, h in enumerate(hashes):
                if h in cached:
                    vectors[i] = cached[h]
            if missing:
                vectors[missing] = embedder.encode([phrases[i] for i in missing])
        return query_vector.result(), vectors

    # rag_graph_explore
    def graph_explore(self, params: dict[str, Any]) -> dict[str, Any]:
        """An entity's neighbourhood: its neighbours, the relation types and weights, and their evidence."""
        arguments = validate_arguments("rag_graph_explore", params)
        collection = self.resolve_collection(arguments.get("collection_id"))
        self.require_index(collection)
        note = self.index_note(collection)  # INDEX_BUILD=background: a graph still being built says so
        limit = int(arguments.get("limit", 20))
        evidence_limit = int(arguments.get("evidence_per_relation", 2))
        relation_type = arguments.get("relation_type")
        table = self.index.entity_table(collection.id, collection.version)
        check_cancelled()
        info = self.index.collection_info(collection.id)
        result: dict[str, Any] = {
            "collection_id": collection.id,
            "query": arguments["entity"],
            "found": False,
            "graph": {
                "extractor": info["extractor"],
                "entities": len(table.rows),
                "documents": table.documents,
            },
            **note,
        }
        match = self._match_entity(arguments["entity"], table)
        if match is None:
            result["suggestions"] = self._suggestions(arguments["entity"], table)
            return result
        entity, method, confidence = match
        check_cancelled()
        relations = [
            r
            for r in self.index.relations_of(collection.id, [entity.id])
            if relation_type is None or r.type == relation_type
        ]
        graph = nx.Graph()
        for relation in relations:
            _add_relation(graph, relation)
        neighbours = sorted(
            graph.adj[entity.id].items() if entity.id in graph else [],
            key=lambda item: (-item[1]["weight"], item[0]),
        )
        shown = neighbours[:limit]
        evidence = defaultdict(list)
        if evidence_limit:
            for row in self.index.evidence_of([r.id for _, data in shown for r in data["relations"]]):
                evidence[row.relation_id].append(row)
        check_cancelled()
        texts = _EvidenceTexts(self, collection.id)
        result.update(
            {
                "found": True,
                "entity": {
                    **_entity_dict(entity),
                    "aliases": self.index.aliases_of(entity.id),
                    "match": {"method": method, "confidence": round(confidence, 4)},
                },
                "neighbour_count": len(neighbours),
                "neighbours": [
                    {
                        "entity": _entity_dict(table.rows[table.row_of_id[neighbour]]),
                        "weight": data["weight"],
                        "relations": [
                            {
                                "type": r.type,
                                "direction": "undirected"
                                if r.type == "co_occurs"
                                else "outgoing"
                                if r.source_id == entity.id
                                else "incoming",
                                "weight": r.weight,
                                "evidence": [
                                    texts.evidence(row)
                                    for row in sorted(evidence[r.id], key=lambda e: (-e.count, e.chunk_id))[
                                        :evidence_limit
                                    ]
                                ],
                            }
                            for r in sorted(data["relations"], key=lambda r: (-r.weight, r.type))
                        ],
                    }
                    for neighbour, data in shown
                    if neighbour in table.row_of_id
                ],
            }
        )
        return result

    def _match_entity(self, text: str, table: EntityTable) -> tuple[EntityRow, str, float] | None:
        """The entity a name means: exact key, then a defined abbreviation, then the closest linked one."""
        key = entity_key(text)
        if key in table.id_of_key:
            return table.rows[table.row_of_id[table.id_of_key[key]]], "exact", 1.0
        aliased = table.ids_of_alias.get(key, [])
        if aliased:
            best = max(aliased, key=lambda i: table.rows[table.row_of_id[i]].document_count)
            return table.rows[table.row_of_id[best]], "alias", 1.0
        threshold = 0.7
        candidates: list[tuple[float, str, EntityRow]] = []
        if len(key) >= 4:
            for _, score, position in process.extract(
                key, table.keys, scorer=fuzz.ratio, score_cutoff=threshold * 100, limit=1
            ):
                candidates.append((score / 100, "fuzzy", table.rows[position]))
        if len(table.vectors):
            similarities = table.vectors @ self.context.embedder.encode_query(text)
            position = int(np.argmax(similarities))
            if similarities[position] >= threshold:
                row = table.rows[int(table.vector_rows[position])]
                candidates.append((float(similarities[position]), "embedding", row))
        if not candidates:
            return None
        confidence, method, row = max(candidates, key=lambda c: c[0])
        return row, method, confidence

    @staticmethod
    def _suggestions(text: str, table: EntityTable) -> list[str]:
        key = entity_key(text) or text.lower()
        return [
            table.rows[position].name
            for _, _, position in process.extract(key, table.keys, scorer=fuzz.WRatio, limit=5)
        ]


def _entity_dict(row: EntityRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "key": row.key,
        "type": row.type,
        "mention_count": row.mention_count,
        "document_count": row.document_count,
    }


class _Names:
    """Entity names by id, looked up on demand."""

    def __init__(self, table: EntityTable) -> None:
        self.table = table

    def get(self, entity_id: int, default: str) -> str:
        """The entity's name, or the default for an id the table does not hold."""
        position = self.table.row_of_id.get(entity_id)
        return default if position is None else self.table.rows[position].name


def _path(reach: Reach, names: _Names) -> dict[str, Any]:
    """A path as a client reads it: the entities in order and each relation with its weight."""
    return {
        "hop": reach.hop,
        "score": round(reach.score, 6),
        "entities": [names.get(e, str(e)) for e in reach.entities],
        "relations": [
            {
                "source": names.get(r.source_id, str(r.source_id)),
                "target": names.get(r.target_id, str(r.target_id)),
                "type": r.type,
                "weight": r.weight,
            }
            for r in reach.relations
        ],
    }


class _EvidenceTexts:
    """Evidence rows with the text that states them (documents read once each)."""

    def __init__(self, pipeline: GraphRagPipeline, collection_id: str) -> None:
        self.store = pipeline.context.store
        self.collection_id = collection_id
        self.documents: dict[str, tuple[str, str]] = {}

    def evidence(self, row: Any) -> dict[str, Any]:
        """document_id, chunk_id, title, field and the sentence (or chunk) that states the relation."""
        if row.document_id not in self.documents:
            document = self.store.get_document(self.collection_id, row.document_id)
            self.documents[row.document_id] = (document.title, document.content) if document else ("", "")
        title, content = self.documents[row.document_id]
        text = (title if row.field == "title" else content)[row.start_char : row.end_char]
        if len(text) > SNIPPET_CHARS:
            text = text[: SNIPPET_CHARS - 1].rstrip() + "…"
        return {
            "document_id": row.document_id,
            "chunk_id": row.chunk_id,
            "title": title,
            "field": row.field,
            "count": row.count,
            "snippet": text,
        }


__all__ = ["GraphRagParams", "GraphRagPipeline", "link_entities", "query_phrases", "walk_graph"]
