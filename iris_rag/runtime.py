"""Process-wide setup that the worker and the command line apply once, at start."""

from __future__ import annotations

import os

import numpy  # noqa: F401  (loads OpenBLAS: threadpoolctl reaches only libraries already loaded)
from threadpoolctl import threadpool_limits

BLAS_THREADS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads() -> None:
    """Run NumPy's BLAS (the vector search, ColBERT's MaxSim) on one thread, unless the user chose a count.

    OpenBLAS threads spin for a while after every matrix product. In this process they starve the
    encode thread and SQLite of cores, and on a small machine they starve every other process too: on
    the 2-core VM, rag_basic over SciFact's 10k chunks took 43 ms at the median with two BLAS threads
    and 24 ms with one (bench_latency, worker and MCP server running beside it). A matrix-vector product
    over a collection's vectors is bound by memory bandwidth, so the second thread bought little.
    Setting OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS, MKL_NUM_THREADS) keeps the user's choice.
    torch's own thread pool is not touched (models/embedder.py sets it per encode).
    """
    if any(os.environ.get(name) for name in BLAS_THREADS_VARIABLES):
        return
    threadpool_limits(limits=1, user_api="blas")
