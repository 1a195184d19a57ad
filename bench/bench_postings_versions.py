"""The SQLite store's keyword postings in memory: what a write costs the next query, as writes accumulate.

A synthetic collection (no store, no model): `--chunks` chunks of `--terms` postings each, term ids drawn
from a Zipf-like distribution over a 30,000-term vocabulary (as a real collection's are), loaded as
postings.KeywordPostings. Then `--writes` one-document writes (a new document of `--per-write` chunks), each
making the next version as the store does on the next search (KeywordPostings.replaced), and after every
write one flat BM25 search of five terms (KeywordPostings.score, top 50). Printed per window of writes:
the median, 95th percentile and worst of the new version's time (the worst: a merge of delta segments),
the median and 95th percentile of the search's, and the postings written since the last compaction.

    .venv/bin/python -m bench.bench_postings_versions [--chunks 1000000] [--writes 2000] [--per-write 2]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine
from iris_rag.backends.sqlite.postings import KeywordPostings, PostingRow
from iris_rag.runtime import limit_blas_threads

VOCABULARY = 30_000


def _blobs(rng: np.random.Generator, chunks: int, terms: int) -> list[bytes]:
    """Each chunk's postings blob (postings.encode's layout), distinct terms in id order."""
    weights = 1.0 / np.arange(1, VOCABULARY + 1)
    drawn = rng.choice(VOCABULARY, size=(chunks, terms * 2), p=weights / weights.sum())
    blobs = []
    for row in drawn:
        ids = np.unique(row)[:terms]
        triples = np.column_stack([ids, rng.integers(0, 2, ids.size), rng.integers(1, 4, ids.size)])
        blobs.append(triples.astype(np.int32).tobytes())
    return blobs


def _delta_postings(postings: KeywordPostings) -> int:
    """Postings written since the last compaction (also in a checkout before the deltas were tiered)."""
    if hasattr(postings, "deltas"):
        return sum(delta.size for delta in postings.deltas)
    return int(getattr(postings, "delta").size)  # noqa: B009 (the attribute of the earlier code)


def measure(chunks: int, terms: int, writes: int, per_write: int, window: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    batch = 100_000
    loaded = [
        [
            (start + i, f"c{start + i}", f"d{(start + i) // 2}", blob)
            for i, blob in enumerate(_blobs(rng, min(batch, chunks - start), terms))
        ]
        for start in range(0, chunks, batch)
    ]
    postings = KeywordPostings.load(loaded)
    del loaded
    print(f"loaded {chunks:,} chunks in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    queries = rng.choice(200, size=(writes, 5))  # frequent terms: long postings lists
    rowid = chunks
    versions, searches, delta = [], [], []
    for write in range(writes):
        rows: list[PostingRow] = [
            (rowid + i, f"c{rowid + i}", f"new{write}", blob)
            for i, blob in enumerate(_blobs(rng, per_write, terms))
        ]
        rowid += per_write
        started = time.perf_counter()
        postings = postings.replaced({f"new{write}"}, rows)
        versions.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        postings.score([int(t) for t in queries[write]], 1.0, 50)
        searches.append(1000 * (time.perf_counter() - started))
        delta.append(_delta_postings(postings))
    windows = []
    for start in range(0, writes, window):
        part = slice(start, start + window)
        windows.append(
            {
                "writes": f"{start + 1}-{min(start + window, writes)}",
                "new_version_ms_p50_p95_max": [
                    round(float(np.percentile(versions[part], q)), 2) for q in (50, 95, 100)
                ],
                "search_ms_p50_p95": [round(float(np.percentile(searches[part], q)), 2) for q in (50, 95)],
                "delta_postings_at_end": delta[min(start + window, writes) - 1],
            }
        )
        print(json.dumps(windows[-1]), file=sys.stderr)
    return {
        "machine": machine(),
        "chunks": chunks,
        "postings_per_chunk": terms,
        "chunks_per_write": per_write,
        "main_postings": int(postings.main.size),
        "windows": windows,
        "new_version_ms_p50_p95_max_all": [
            round(float(np.percentile(versions, q)), 2) for q in (50, 95, 100)
        ],
        "search_ms_p50_p95_all": [round(float(np.percentile(searches, q)), 2) for q in (50, 95)],
    }


def main() -> None:
    limit_blas_threads()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--terms", type=int, default=40, help="postings per chunk")
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--per-write", type=int, default=2, help="chunks of each write's document")
    parser.add_argument("--window", type=int, default=250)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = measure(args.chunks, args.terms, args.writes, args.per_write, args.window)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
