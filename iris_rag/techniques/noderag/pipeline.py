"""NodeRAG: score the sentence nodes of every document's tree, then build each result's context up the tree.

Retrieval is exact cosine over the collection's leaf (sentence) vectors. Matches in one paragraph become one
result. Its context is the matched sentences, `context_window` sibling sentences on each side of each, and,
with `include_parent_context`, what each ancestor up to `node_depth` levels contributes: its heading (for a
section) and its key sentence (the sentence nearest its centroid, chosen at ingest). `aggregation_strategy`
turns those nodes into the result's text and score.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from iris_rag.llm import Produced, TechniqueLLM
from iris_rag.pipeline import Pipeline, PipelineContext, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.stores.base import CollectionInfo, StoredChunk, StoredDocument
from iris_rag.stores.filters import parse_filters
from iris_rag.techniques.noderag.index import LEAF_TEXT, NodeTreeIndex, ancestors
from iris_rag.techniques.noderag.storage import LeafMatrix, Node, Vectors

Aggregation = Literal["concatenate", "summarize", "weighted"]

# The extractive summary keeps this many context sentences (those nearest the query).
SUMMARY_SENTENCES = 2
SUMMARY_MAX_TOKENS = 200
# LLM summaries of one response are written this many at a time.
SUMMARY_CALLS = 4
# weighted: a context node's weight halves with every step (sibling or tree level) away from the match.
WEIGHT_DECAY = 0.5
# weighted: the score is this share of the best sentence's cosine plus the rest of the weighted mean cosine of
# its neighbourhood (0.8 with WEIGHT_DECAY 0.5 was best on a SciFact train sample; an even blend lost 0.02).
WEIGHTED_MATCH_SHARE = 0.8
# weighted re-ranks, so it looks at more candidate results than it returns.
WEIGHTED_CANDIDATES = 2

SUMMARY_PROMPT = (
    "You condense an excerpt of a document into a short summary that keeps what bears on the question. "
    "Use only the excerpt; add nothing that it does not say. Reply with the summary only, at most three "
    "sentences."
)


class NodeRagParams(BaseModel):
    """technique_params of rag_noderag (schema: schemas/tools/rag_noderag.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_depth: int = Field(3, ge=1, le=10)
    context_window: int = Field(2, ge=1, le=10)
    include_parent_context: bool = True
    aggregation_strategy: Aggregation = "concatenate"

    @model_validator(mode="after")
    def _depth_needs_parents(self) -> NodeRagParams:
        if "node_depth" in self.model_fields_set and not self.include_parent_context:
            msg = "node_depth sets how far parent context reaches: it needs include_parent_context=true"
            raise ValueError(msg)
        return self


@dataclass
class _Result:
    """One paragraph's matches and the context built around them."""

    document_id: str
    paragraph_id: int
    matches: list[tuple[int, float]] = field(default_factory=list)  # (leaf node id, cosine), best first
    score: float = 0.0
    content: str = ""
    start: int = 0
    end: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    summary_prompt: str = ""

    @property
    def best(self) -> int:
        return self.matches[0][0]


@dataclass(frozen=True)
class _Tree:
    """A document with its nodes and leaf vectors, as retrieval reads them."""

    document: StoredDocument
    nodes: list[Node]
    vectors: Vectors
    row_of: dict[int, int]

    def similarity(self, node_id: int, query_vector: npt.NDArray[np.float32]) -> float:
        return float(self.vectors[self.row_of[node_id]] @ query_vector)

    def text(self, node_id: int) -> str:
        return self.nodes[node_id].text(self.document.content)


class NodeRagPipeline(Pipeline):
    """Sentence-level matching with context assembled from the document tree."""

    technique = "noderag"
    params_model = NodeRagParams

    def __init__(self, context: PipelineContext) -> None:
        super().__init__(context)
        self._index = NodeTreeIndex(context.embedder, context.store, context.settings.embedding_model_id)
        self._llm = TechniqueLLM(context.settings)

    def technique_index(self) -> NodeTreeIndex:
        """The node tree, built at ingest."""
        return self._index

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: NodeRagParams
    ) -> Retrieval:
        """Rank leaf nodes, group matches by paragraph, assemble each group's context up the tree."""
        self.require_index(collection)
        store = self.context.store
        leaves = self._index.leaf_matrix(collection.id, collection.version)
        query_vector = self.context.embedder.encode_query(query)
        scores = leaves.matrix @ query_vector if leaves.document_ids else np.zeros(0, dtype=np.float32)
        metadata_filter = parse_filters(options.filters)
        searched = len(leaves.document_ids)
        if metadata_filter is not None and searched:
            allowed = store.matching_document_ids(collection.id, metadata_filter)
            mask = np.fromiter((d in allowed for d in leaves.document_ids), dtype=bool, count=searched)
            scores = np.where(mask, scores, -np.inf).astype(np.float32)
            searched = int(mask.sum())

        weighted = params.aggregation_strategy == "weighted"
        wanted = options.top_k * WEIGHTED_CANDIDATES if weighted else options.top_k
        results, scanned = _group_matches(leaves, scores, searched, wanted)
        trees = self._trees(collection.id, [r.document_id for r in results])
        results = [r for r in results if r.document_id in trees]
        for result in results:
            self._assemble(result, trees[result.document_id], query, query_vector, params)
        if weighted:
            results.sort(key=lambda r: -r.score)
        results = results[: options.top_k]
        summarize = params.aggregation_strategy == "summarize"
        summaries = self._summarize(results) if summarize else []

        documents = [
            RetrievedDocument(_chunk(result, trees[result.document_id]), result.score, result.details)
            for result in results
        ]
        specific: dict[str, Any] = {
            "node_depth": params.node_depth if params.include_parent_context else None,
            "context_window": params.context_window,
            "include_parent_context": params.include_parent_context,
            "aggregation_strategy": params.aggregation_strategy,
            "leaf_text": LEAF_TEXT,
            "leaf_nodes_searched": searched,
            "leaf_nodes_scanned": scanned,
            "merged_matches": sum(len(r.matches) - 1 for r in results),
            "results": [
                {
                    "chunk_id": d.chunk.chunk_id,
                    "node_path": d.details["path"],
                    "matched_node_ids": [m["node_id"] for m in d.details["matched_nodes"]],
                    "context_node_ids": [c["node_id"] for c in d.details["context_nodes"]],
                }
                for d in documents
            ],
        }
        if summarize:
            specific["summary_source"] = _summary_source(summaries)
            errors = sorted({s.error for s in summaries if s.error})
            if errors:
                specific["llm_errors"] = errors
        return Retrieval(documents, len(leaves.document_ids), specific)

    def query_similarities(
        self, query: str, collection: CollectionInfo, documents: list[RetrievedDocument]
    ) -> dict[str, float]:
        """Each result's query cosine, on every technique's scale: the best stored chunk holding its matches.

        Its chunk id names a node, which has no stored vector. Not the sentence's own cosine: a short text
        scores about 0.1 above a chunk, so an off-topic question passed the relevance floor and min_similarity
        that rag_basic's chunks fail (docs/benchmarks.md, "Nothing relevant").
        """
        store = self.context.store
        holders: dict[str, list[str]] = {}  # result chunk id -> the stored chunks holding its matches
        chunks_of: dict[str, list[StoredChunk]] = {}
        for document in documents:
            document_id = document.chunk.document_id
            if document_id not in chunks_of:
                chunks_of[document_id] = store.get_document_chunks(collection.id, document_id)
            matches = [c for c in document.details["context_nodes"] if c["role"] == "match"]
            holders[document.chunk.chunk_id] = [
                chunk.chunk_id
                for chunk in chunks_of[document_id]
                if any(chunk.start_char < m["end_char"] and m["start_char"] < chunk.end_char for m in matches)
            ]
        vector = self.context.embedder.encode_query(query)  # remembered from retrieve()
        scores = store.vector_scores(collection.id, vector, [c for ids in holders.values() for c in ids])
        return {
            result: max(scores[c] for c in ids if c in scores)
            for result, ids in holders.items()
            if any(c in scores for c in ids)
        }

    def _trees(self, collection_id: str, document_ids: list[str]) -> dict[str, _Tree]:
        store = self.context.store
        stored = self._index.document_trees(collection_id, document_ids)
        trees = {}
        for document_id, tree in stored.items():
            document = store.get_document(collection_id, document_id)
            if document is None:
                continue  # deleted since the leaf matrix was read
            leaf_ids = [n.node_id for n in tree.nodes if n.kind == "sentence"]
            row_of = {n: row for row, n in enumerate(leaf_ids)}
            trees[document_id] = _Tree(document, tree.nodes, tree.vectors, row_of)
        return trees

    def _assemble(
        self,
        result: _Result,
        tree: _Tree,
        query: str,
        query_vector: npt.NDArray[np.float32],
        params: NodeRagParams,
    ) -> None:
        """Choose the result's context nodes, then aggregate them into its text and score."""
        nodes = tree.nodes
        best = result.best
        # Siblings: context_window on each side of every match, within its paragraph.
        distance: dict[int, int] = {}
        for match, _ in result.matches:
            for node_id, steps in _window(nodes, match, params.context_window).items():
                distance[node_id] = min(steps, distance.get(node_id, steps))
        matched = {node_id for node_id, _ in result.matches}
        roles = {n: "match" if n in matched else "sibling" for n in distance}
        # Ancestors up to node_depth levels: a section's heading and every ancestor's key sentence.
        lineage = ancestors(nodes, best)
        reached = lineage[: params.node_depth] if params.include_parent_context else []
        key_of: dict[int, int] = {}
        for steps, ancestor in enumerate(reached, start=1):
            key = ancestor.key_sentence_id
            if key is not None and key not in distance:
                distance[key] = steps
                roles[key] = "key_sentence"
                key_of[key] = ancestor.node_id
        headings = [a.label for a in reversed(reached) if a.kind == "section" and a.label]
        sentences = sorted(distance, key=lambda n: nodes[n].start)
        similarity = {n: tree.similarity(n, query_vector) for n in sentences}
        weight = {n: WEIGHT_DECAY ** distance[n] for n in sentences}

        result.score = result.matches[0][1]
        extra: dict[str, Any] = {}
        strategy = params.aggregation_strategy
        if strategy == "concatenate":
            result.content = _join(tree, sentences, headings)
        elif strategy == "weighted":
            # The score: the best match blended with its own neighbourhood (window and ancestors), so that
            # a sentence among relevant neighbours outranks an isolated one; the text: most relevant first.
            around = _window(nodes, best, params.context_window)
            for steps, ancestor in enumerate(reached, start=1):
                if ancestor.key_sentence_id is not None:
                    around.setdefault(ancestor.key_sentence_id, steps)
            local = {n: WEIGHT_DECAY**steps for n, steps in around.items()}
            mean = sum(local[n] * similarity[n] for n in around) / sum(local.values())
            result.score = WEIGHTED_MATCH_SHARE * result.score + (1 - WEIGHTED_MATCH_SHARE) * mean
            extra = {
                "neighbourhood_mean": round(mean, 6),
                "neighbourhood": [
                    {
                        "node_id": n,
                        "distance": steps,
                        "weight": local[n],
                        "similarity": round(similarity[n], 6),
                    }
                    for n, steps in sorted(around.items(), key=lambda item: nodes[item[0]].start)
                ],
            }
            ordered = sorted(sentences, key=lambda n: (-weight[n] * similarity[n], nodes[n].start))
            result.content = _lines(tree, ordered, headings)
        else:
            chosen = sorted(sentences, key=lambda n: (-similarity[n], nodes[n].start))[:SUMMARY_SENTENCES]
            extractive = _join(tree, sorted(chosen, key=lambda n: nodes[n].start), headings)
            excerpt = _join(tree, sentences, headings)
            title = tree.document.title or tree.document.id
            result.content = extractive
            result.summary_prompt = f"Question: {query}\n\nDocument: {title}\n\nExcerpt:\n{excerpt}"

        spans = [nodes[n] for n in sentences]
        result.start, result.end = min(n.start for n in spans), max(n.end for n in spans)
        result.details = {
            "leaf_score": round(result.matches[0][1], 6),
            "score": round(result.score, 6),
            "aggregation": strategy,
            "path": " > ".join(_label(tree, n) for n in [*reversed(lineage), nodes[best]]),
            "node_path": [_describe(tree, n) for n in [*reversed(lineage), nodes[best]]],
            "matched_nodes": [
                {"node_id": node_id, "score": round(score, 6)} for node_id, score in result.matches
            ],
            "context_nodes": [
                {
                    **_describe(tree, nodes[n]),
                    "role": roles[n],
                    "distance": distance[n],
                    "similarity": round(similarity[n], 6),
                    **({"key_sentence_of": key_of[n]} if n in key_of else {}),
                    **({"weight": round(weight[n], 6)} if strategy == "weighted" else {}),
                }
                for n in sentences
            ],
            "ancestors_reached": [_describe(tree, a) for a in reached],
            **extra,
        }

    def _summarize(self, results: list[_Result]) -> list[Produced]:
        """Summaries by the configured LLM (a few calls at a time), or the extractive ones already built."""

        def summarize(result: _Result) -> Produced:
            extractive = result.content
            return self._llm.produce(
                SUMMARY_PROMPT,
                result.summary_prompt,
                max_tokens=SUMMARY_MAX_TOKENS,
                fallback_name="extractive",
                fallback=lambda: extractive,
            )

        if not self._llm.available or len(results) < 2:
            produced = [summarize(result) for result in results]
        else:
            with ThreadPoolExecutor(min(SUMMARY_CALLS, len(results))) as pool:
                produced = list(pool.map(summarize, results))
        for result, summary in zip(results, produced, strict=True):
            result.content = summary.text
            result.details["summary_source"] = summary.source
            if summary.error:
                result.details["llm_error"] = summary.error
        return produced


def _group_matches(leaves: LeafMatrix, scores: Vectors, valid: int, wanted: int) -> tuple[list[_Result], int]:
    """Walk the leaves best first, one result per paragraph, until a leaf would open result wanted + 1.

    A sentence whose paragraph already has a result joins it (its window widens that result's context)
    instead of coming back a second time, so no context is returned twice.
    """
    results: dict[tuple[str, int], _Result] = {}
    seen: set[int] = set()  # rows already walked (a deeper top list repeats them, tied scores in any order)
    depth = min(valid, max(4 * wanted, 64))
    while depth > len(seen):
        for row in _top_indices(scores, depth).tolist():
            if row in seen:
                continue
            key = (leaves.document_ids[row], int(leaves.parent_ids[row]))
            result = results.get(key)
            if result is None:
                if len(results) >= wanted:
                    return list(results.values()), len(seen)
                result = results[key] = _Result(key[0], key[1])
            result.matches.append((int(leaves.node_ids[row]), float(scores[row])))
            seen.add(row)
        depth = min(valid, depth * 4)
    return list(results.values()), len(seen)


def _top_indices(scores: Vectors, k: int) -> npt.NDArray[np.intp]:
    """Indices of the k best scores, best first (ties by position)."""
    k = min(k, scores.shape[0])
    if k <= 0:
        return np.zeros(0, dtype=np.intp)
    candidates = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(scores.shape[0])
    return candidates[np.lexsort((candidates, -scores[candidates]))]


def _window(nodes: list[Node], match: int, window: int) -> dict[int, int]:
    """The match and up to `window` siblings on each side of it, with their distance in sibling steps."""
    found = {match: 0}
    for direction in ("prev_id", "next_id"):
        current = nodes[match]
        for step in range(1, window + 1):
            neighbour: int | None = getattr(current, direction)
            if neighbour is None:
                break
            found[neighbour] = step
            current = nodes[neighbour]
    return found


def _runs(nodes: list[Node], sentences: list[int]) -> list[list[int]]:
    """Sentences (in document order) grouped into runs of adjacent siblings."""
    runs: list[list[int]] = []
    for node_id in sentences:
        if runs and nodes[node_id].prev_id == runs[-1][-1]:
            runs[-1].append(node_id)
        else:
            runs.append([node_id])
    return runs


def _join(tree: _Tree, sentences: list[int], headings: list[str]) -> str:
    """Sentences in document order, verbatim; ' … ' marks a gap in a paragraph, a blank line a new one."""
    nodes, content = tree.nodes, tree.document.content
    text = ""
    previous: list[int] | None = None
    for run in _runs(nodes, sentences):
        if previous is not None:
            same = nodes[run[0]].parent_id == nodes[previous[-1]].parent_id
            text += " … " if same else "\n\n"
        text += content[nodes[run[0]].start : nodes[run[-1]].end]
        previous = run
    return f"{' > '.join(headings)}\n\n{text}" if headings else text


def _lines(tree: _Tree, ordered: list[int], headings: list[str]) -> str:
    """Sentences one per line in the given order (weighted: most relevant first)."""
    text = "\n".join(tree.text(n) for n in ordered)
    return f"{' > '.join(headings)}\n\n{text}" if headings else text


def _label(tree: _Tree, node: Node) -> str:
    if node.kind == "document":
        return f"document {tree.document.title or tree.document.id!r}"
    if node.kind == "section" and node.label:
        return f"section {node.label!r}"
    return f"{node.kind} {node.position + 1}"


def _describe(tree: _Tree, node: Node) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "kind": node.kind,
        "label": _label(tree, node),
        "start_char": node.start,
        "end_char": node.end,
    }


def _chunk(result: _Result, tree: _Tree) -> StoredChunk:
    document = tree.document
    return StoredChunk(
        chunk_id=f"{document.id}#node-{result.best}",
        document_id=document.id,
        index=result.best,
        content=result.content,
        start_char=result.start,
        end_char=result.end,
        title=document.title,
        metadata=document.metadata,
    )


def _summary_source(summaries: list[Produced]) -> str:
    """Which path wrote the summaries: llm, extractive, mixed (some LLM calls failed) or none."""
    sources = {s.source for s in summaries}
    if not sources:
        return "none"
    return sources.pop() if len(sources) == 1 else "mixed"
