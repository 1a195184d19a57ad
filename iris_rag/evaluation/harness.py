"""Run every query through each technique's real retrieval path and score the document rankings."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError
from tqdm import tqdm

from iris_rag.errors import InvalidParametersError
from iris_rag.evaluation.beir import BeirDataset
from iris_rag.evaluation.collection import ensure_collection
from iris_rag.evaluation.metrics import score_run
from iris_rag.evaluation.report import QRELS_FILE, write_qrels, write_run
from iris_rag.evaluation.techniques import TechniqueSpec
from iris_rag.pipeline import Pipeline, QueryOptions, RetrievedDocument
from iris_rag.service import RagService
from iris_rag.stores.base import CollectionInfo
from iris_rag.validation import model_errors

# Documents are chunked: ask for this many chunks per wanted document so that k distinct ones come back.
CHUNKS_PER_DOCUMENT = 3
# model_copy skips validation: the public cap on top_k (50) is for answers, not for ranking depth.
_OPTIONS = QueryOptions(generate=False)


@dataclass(frozen=True)
class TechniqueRun:
    """One technique's document rankings (best first) and per-query retrieval times."""

    spec: TechniqueSpec
    rankings: dict[str, list[str]]
    latencies_ms: list[float]


def document_ranking(documents: Sequence[RetrievedDocument], k: int, exclude: str | None = None) -> list[str]:
    """Chunk ranking → document ranking: each document at its best chunk, `exclude` dropped, at most k."""
    ranking: dict[str, None] = {}
    for document in documents:
        document_id = document.chunk.document_id
        # BEIR drops a hit whose id is the query's own id (datasets where queries are also documents).
        if document_id != exclude:
            ranking.setdefault(document_id, None)
            if len(ranking) >= k:
                break
    return list(ranking)


def validate_params(service: RagService, spec: TechniqueSpec) -> BaseModel:
    """The technique's parameters, checked by its own model before anything is ingested."""
    try:
        return service.pipelines[spec.base].params_model.model_validate(spec.params)
    except ValidationError as exc:
        errors = model_errors(exc)
        msg = f"invalid parameters for {spec.name} ({spec.base}): {'; '.join(errors)}"
        raise InvalidParametersError(msg, {"errors": errors}) from exc


def rank(
    pipeline: Pipeline, collection: CollectionInfo, query: str, query_id: str, k: int, params: BaseModel
) -> list[str]:
    """The top k documents for one query; asks for deeper chunk lists until k distinct documents come."""
    depth = min(CHUNKS_PER_DOCUMENT * k, max(collection.chunk_count, 1))
    while True:
        options = _OPTIONS.model_copy(update={"top_k": depth})
        documents = pipeline.retrieve(query, collection, options, params).documents
        ranking = document_ranking(documents, k, exclude=query_id)
        if len(ranking) >= k or len(documents) < depth or depth >= collection.chunk_count:
            return ranking
        depth = min(depth * 2, collection.chunk_count)


def run_technique(
    service: RagService,
    spec: TechniqueSpec,
    collection_id: str,
    queries: dict[str, str],
    k: int,
    *,
    progress: bool = True,
) -> TechniqueRun:
    """Rank every query with one technique, timing each retrieval."""
    pipeline = service.pipelines[spec.base]
    collection = pipeline.resolve_collection(collection_id)
    params = validate_params(service, spec)
    rankings: dict[str, list[str]] = {}
    latencies: list[float] = []
    if queries:
        # One untimed query first: the store builds its vector matrix (and caches) on first use.
        first_id, first_text = next(iter(queries.items()))
        rank(pipeline, collection, first_text, first_id, k, params)
    for query_id, text in tqdm(
        queries.items(),
        desc=spec.name,
        unit="query",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=not progress,
    ):
        started = time.perf_counter()
        rankings[query_id] = rank(pipeline, collection, text, query_id, k, params)
        latencies.append((time.perf_counter() - started) * 1000)
    return TechniqueRun(spec, rankings, latencies)


def summarize(dataset: BeirDataset, run: TechniqueRun) -> dict[str, Any]:
    """The report entry of one technique: the four measures and retrieval latency."""
    qrels = {q: dataset.qrels[q] for q in run.rankings}
    metrics = score_run(qrels, run.rankings)
    latencies = np.array(run.latencies_ms or [0.0])
    return {
        **{key: round(value, 5) for key, value in metrics.items()},
        "latency_ms": {
            "p50": round(float(np.percentile(latencies, 50)), 3),
            "p95": round(float(np.percentile(latencies, 95)), 3),
        },
    }


def check_trec_ids(dataset: BeirDataset) -> None:
    """Refuse ids a TREC file cannot hold: its columns are separated by whitespace."""
    ids = [
        *dataset.qrels,
        *(d for docs in dataset.qrels.values() for d in docs),
        *(str(d.id) for d in dataset.corpus),
    ]
    spaced = [i for i in ids if not i or any(c.isspace() for c in i)]
    if spaced:
        example = ", ".join(map(repr, spaced[:3]))
        msg = f"--runs: {len(spaced)} ids are empty or hold whitespace (e.g. {example}): a TREC file cannot"
        raise InvalidParametersError(msg)


def evaluate(
    service: RagService,
    dataset: BeirDataset,
    specs: Sequence[TechniqueSpec],
    *,
    k: int,
    collection_id: str,
    chunk_size: int,
    chunk_overlap: int | None = None,
    runs: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Ingest the corpus if needed, run each technique over every query, and return the report.

    `runs`: a folder to write each technique's ranking to as a TREC run file, with the qrels scored.
    """
    for spec in specs:
        validate_params(service, spec)  # a typo in --params fails now, not after a long ingest
    if runs is not None:
        check_trec_ids(dataset)
    chunking = service.ingestor.chunking(chunk_size, chunk_overlap)
    prepared = ensure_collection(
        service,
        dataset,
        collection_id,
        chunking=chunking,
        progress=progress,
        techniques=[spec.base for spec in specs],
    )
    service.embedder.wait_ready()
    chunk_size_used, chunk_overlap_used = prepared.chunking or (None, None)
    if runs is not None:
        write_qrels(runs / QRELS_FILE, dataset.qrels)
    techniques = {}
    for spec in specs:
        run = run_technique(service, spec, collection_id, dataset.queries, k, progress=progress)
        if runs is not None:
            write_run(runs / f"{spec.name}.run", spec.name, run.rankings)
        techniques[spec.name] = summarize(dataset, run)
    return {
        "dataset": dataset.name,
        "documents": len(dataset.corpus),
        "queries": len(dataset.queries),
        "techniques": techniques,
        "split": dataset.split,
        "k": k,
        "collection": collection_id,
        # null when the collection holds documents whose chunking eval did not record
        "chunk_size": chunk_size_used,
        "chunk_overlap": chunk_overlap_used,
        "documents_ingested": prepared.ingested,
        "duplicate_corpus_ids": len(dataset.duplicate_ids),
        "unjudged_queries": dataset.unjudged_queries,
        "embedding_model": service.settings.embedding_model_id,
        "technique_params": {spec.name: {"technique": spec.base, "params": spec.params} for spec in specs},
    }
