"""The evaluation collection: a dataset's corpus ingested once, reused while it holds the corpus as it is."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from tqdm import tqdm

from iris_rag.errors import InvalidParametersError
from iris_rag.evaluation.beir import BeirDataset
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.text import without_nul

INGEST_BATCH = 256
MAX_COLLECTION_ID = 64
_DEFAULT_CHUNK_SIZE = Settings.model_fields["chunk_size"].default
_DEFAULT_CHUNK_OVERLAP = Settings.model_fields["chunk_overlap"].default


def collection_name(dataset: str, chunk_size: int, chunk_overlap: int) -> str:
    """eval-<dataset>, plus the chunking when it is not the default (the store does not record it)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", dataset).strip("-.") or "dataset"
    suffix = "" if chunk_size == _DEFAULT_CHUNK_SIZE else f"-c{chunk_size}"
    suffix += "" if chunk_overlap == _DEFAULT_CHUNK_OVERLAP else f"-o{chunk_overlap}"
    return f"eval-{slug}"[: MAX_COLLECTION_ID - len(suffix)] + suffix


def ensure_collection(
    service: RagService,
    dataset: BeirDataset,
    collection_id: str,
    *,
    chunk_size: int,
    progress: bool = True,
    techniques: Sequence[str] = (),
) -> int:
    """Ingest the corpus documents the collection lacks or holds another version of; return how many.

    All of them the first time; later, those added to the corpus or edited in it since (title or text).
    When an evaluated technique's index does not cover the collection (it was built while that technique
    was not served), the whole corpus is ingested again: cached embeddings make that cost only the index.
    """
    store = service.store
    collection = store.get_collection(collection_id)
    missing: list[SourceDocument] = []
    changed: list[SourceDocument] = []
    for doc in dataset.corpus if collection is not None else []:
        stored = store.get_document(collection_id, str(doc.id))
        if stored is None:
            missing.append(doc)
        elif (stored.title, stored.content) != (without_nul(doc.title), without_nul(doc.content)):
            changed.append(doc)  # as the ingest stores it, NUL characters dropped
    held = len(dataset.corpus) - len(missing)
    if collection is not None and collection.document_count > held:
        # Documents that are not in the corpus would be retrieved and count against every technique.
        extra = collection.document_count - held
        msg = (
            f"collection {collection_id!r} holds {extra} documents that are not in the corpus; "
            f"pass another --collection, or start afresh: iris-rag delete-collection {collection_id} --yes"
        )
        raise InvalidParametersError(msg)
    if changed:
        print(
            f"eval: {len(changed)} corpus documents changed since {collection_id} was ingested; "
            "ingesting them again",
            file=sys.stderr,
        )
    missing = dataset.corpus if collection is None else [*missing, *changed]
    stale = sorted(set(service.stale_indexes(collection_id)) & set(techniques)) if collection else []
    if stale and service.index_builder is not None:
        # INDEX_BUILD=background: queue what these indexes lack (the CLI's builder scanned no collection).
        service.index_builder.rescan(collection_id)
        print(f"eval: the {', '.join(stale)} index of {collection_id} is being built", file=sys.stderr)
    elif stale:
        print(f"eval: building the {', '.join(stale)} index for {collection_id}", file=sys.stderr)
        missing = dataset.corpus
    if not missing:
        service.wait_for_indexes(collection_id)  # evaluations see complete indexes
        return 0
    service.embedder.wait_ready()
    ingested = 0
    with tqdm(
        total=len(missing),
        desc=f"ingest {collection_id}",
        unit="doc",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=not progress,
    ) as bar:
        for start in range(0, len(missing), INGEST_BATCH):
            batch = missing[start : start + INGEST_BATCH]
            result = service.ingestor.ingest(collection_id, batch, chunk_size=chunk_size)
            ingested += len(result.document_ids)
            for error in result.errors:
                tqdm.write(f"skipped document {error['id']}: {error['message']}", file=sys.stderr)
            bar.update(len(batch))
    service.wait_for_indexes(collection_id)  # evaluations see complete indexes
    return ingested
