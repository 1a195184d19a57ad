"""The evaluation collection: a dataset's corpus ingested once, reused while it holds the corpus as it is."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
# Document metadata in which eval records the chunking it ingested each document with (the store keeps none).
CHUNK_SIZE_KEY = "chunk_size"
CHUNK_OVERLAP_KEY = "chunk_overlap"


def collection_name(dataset: str, chunk_size: int, chunk_overlap: int) -> str:
    """eval-<dataset>, plus the chunking when it is not the default: another chunking gets its own."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", dataset).strip("-.") or "dataset"
    suffix = "" if chunk_size == _DEFAULT_CHUNK_SIZE else f"-c{chunk_size}"
    suffix += "" if chunk_overlap == _DEFAULT_CHUNK_OVERLAP else f"-o{chunk_overlap}"
    return f"eval-{slug}"[: MAX_COLLECTION_ID - len(suffix)] + suffix


@dataclass(frozen=True)
class PreparedCollection:
    """What ensure_collection did: documents ingested, and the chunking every stored document has.

    The chunking is None (unknown) when some document was stored without eval's record of it: by an
    `iris-rag ingest`, or by an eval from before the record was kept.
    """

    ingested: int
    chunking: tuple[int, int] | None


def recorded_chunking(metadata: Mapping[str, Any]) -> tuple[int, int] | None:
    """The chunk size and overlap eval recorded in a document's metadata when it ingested it."""
    size, overlap = metadata.get(CHUNK_SIZE_KEY), metadata.get(CHUNK_OVERLAP_KEY)
    return (size, overlap) if isinstance(size, int) and isinstance(overlap, int) else None


def ensure_collection(
    service: RagService,
    dataset: BeirDataset,
    collection_id: str,
    *,
    chunking: tuple[int, int],
    progress: bool = True,
    techniques: Sequence[str] = (),
) -> PreparedCollection:
    """Ingest the corpus documents the collection lacks or holds another version of.

    All of them the first time; later, those added to the corpus or edited in it since (title or text).
    When an evaluated technique's index does not cover the collection (it was built while that technique
    was not served), the whole corpus is ingested again: cached embeddings make that cost only the index.
    A collection whose documents eval chunked otherwise is refused: its figures would be another chunking's.
    """
    store = service.store
    collection = store.get_collection(collection_id)
    missing: list[SourceDocument] = []
    changed: list[SourceDocument] = []
    unrecorded: set[str] = set()
    for doc in dataset.corpus if collection is not None else []:
        stored = store.get_document(collection_id, str(doc.id))
        if stored is None:
            missing.append(doc)
            continue
        if (stored.title, stored.content) != (without_nul(doc.title), without_nul(doc.content)):
            changed.append(doc)  # as the ingest stores it, NUL characters dropped
        recorded = recorded_chunking(stored.metadata)
        if recorded is None:
            unrecorded.add(stored.id)
        elif recorded != chunking:
            msg = (
                f"collection {collection_id!r} was chunked with chunk_size {recorded[0]}, chunk_overlap "
                f"{recorded[1]}, not the {chunking[0]}, {chunking[1]} asked for; pass another --collection, "
                f"or start afresh: iris-rag delete-collection {collection_id} --yes"
            )
            raise InvalidParametersError(msg)
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
    ingested = _ingest(service, collection_id, missing, chunking, progress=progress)
    service.wait_for_indexes(collection_id)  # evaluations see complete indexes
    unrecorded -= ingested
    if unrecorded:
        print(
            f"eval: {len(unrecorded)} documents of {collection_id} carry no record of their chunking "
            "(ingested by iris-rag ingest, or by an eval from before it kept one): the report gives "
            "chunk_size and chunk_overlap as null; for a known chunking, start afresh: "
            f"iris-rag delete-collection {collection_id} --yes",
            file=sys.stderr,
        )
    return PreparedCollection(len(ingested), None if unrecorded else chunking)


def _ingest(
    service: RagService,
    collection_id: str,
    documents: list[SourceDocument],
    chunking: tuple[int, int],
    *,
    progress: bool,
) -> set[str]:
    """Ingest the documents with their chunking recorded in their metadata; the ids stored."""
    if not documents:
        return set()
    service.embedder.wait_ready()
    size, overlap = chunking
    record = {CHUNK_SIZE_KEY: size, CHUNK_OVERLAP_KEY: overlap}
    ingested: set[str] = set()
    with tqdm(
        total=len(documents),
        desc=f"ingest {collection_id}",
        unit="doc",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=not progress,
    ) as bar:
        for start in range(0, len(documents), INGEST_BATCH):
            batch = [
                replace(doc, metadata={**doc.metadata, **record})
                for doc in documents[start : start + INGEST_BATCH]
            ]
            result = service.ingestor.ingest(collection_id, batch, chunk_size=size, chunk_overlap=overlap)
            ingested.update(result.document_ids)
            for error in result.errors:
                tqdm.write(f"skipped document {error['id']}: {error['message']}", file=sys.stderr)
            bar.update(len(batch))
    return ingested
