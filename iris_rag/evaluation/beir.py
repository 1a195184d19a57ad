"""BEIR-format datasets: corpus.jsonl, queries.jsonl (or queries_<split>.jsonl) and qrels/<split>.tsv."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.loaders import SourceDocument

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class BeirDataset:
    """A corpus, the queries to evaluate (those with a judged-relevant document) and their judgments."""

    name: str
    path: Path
    split: str
    corpus: list[SourceDocument]
    queries: dict[str, str]
    qrels: Qrels

    def limited(self, count: int) -> BeirDataset:
        """The same dataset with only its first `count` queries (a quick run)."""
        queries = dict(list(self.queries.items())[:count])
        return replace(self, queries=queries, qrels={q: self.qrels[q] for q in queries})


def load_beir(path: Path, split: str = "test") -> BeirDataset:
    """Read a BEIR folder; queries without a judged-relevant document are dropped, as BEIR does."""
    if not path.is_dir():
        msg = f"dataset folder {str(path)!r} does not exist"
        raise InvalidParametersError(msg)
    qrels_file = _required(path / "qrels" / f"{split}.tsv")
    qrels = _read_qrels(qrels_file)
    # A split may ship its own queries file (queries_train.jsonl); otherwise queries.jsonl holds them all.
    queries_file = path / f"queries_{split}.jsonl"
    all_queries = {
        str(record["_id"]): str(record["text"])
        for record in _read_jsonl(
            _required(queries_file if queries_file.exists() else path / "queries.jsonl")
        )
    }
    judged = {qid for qid, docs in qrels.items() if any(score > 0 for score in docs.values())}
    if not judged:  # nothing to score: all-zero measures would read as a result
        msg = (
            f"no judged queries in {str(qrels_file)!r} for split {split!r}: "
            "it needs query-id, corpus-id, score rows with a score above 0"
        )
        raise InvalidParametersError(msg)
    queries = {qid: text for qid, text in all_queries.items() if qid in judged}
    unknown = judged - queries.keys()
    if unknown:
        example = ", ".join(sorted(unknown)[:5])
        msg = f"{len(unknown)} judged query ids are not in the queries file (e.g. {example})"
        raise InvalidParametersError(msg)
    corpus = [_corpus_document(record) for record in _read_jsonl(_required(path / "corpus.jsonl"))]
    return BeirDataset(path.resolve().name, path, split, corpus, queries, {q: qrels[q] for q in queries})


def _corpus_document(record: dict[str, Any]) -> SourceDocument:
    title = str(record.get("title") or "").strip()
    text = str(record.get("text") or "").strip()
    # BEIR encodes title + text, so a title-only record is still searchable; the ingestor needs content.
    return SourceDocument(id=str(record["_id"]), content=text or title, title=title)


def _required(path: Path) -> Path:
    if not path.is_file():
        msg = f"missing {str(path)!r}: not a BEIR folder, or no such split"
        raise InvalidParametersError(msg)
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                msg = f"{path}:{number}: invalid JSON: {exc}"
                raise InvalidParametersError(msg) from exc
            if not isinstance(record, dict) or "_id" not in record:
                msg = f"{path}:{number}: expected an object with an '_id'"
                raise InvalidParametersError(msg)
            records.append(record)
    return records


def _read_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    with path.open(encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t"), start=1):
            if not row or (number == 1 and row[0] == "query-id"):
                continue
            if len(row) < 3:
                msg = f"{path}:{number}: expected query-id, corpus-id, score"
                raise InvalidParametersError(msg)
            # Three columns in BEIR; four (query, iteration, doc, score) in the TREC qrels format.
            query_id, doc_id, score = row[0], row[2 if len(row) >= 4 else 1], row[-1]
            try:
                qrels.setdefault(query_id, {})[doc_id] = int(score)
            except ValueError as exc:
                msg = f"{path}:{number}: score {score!r} is not an integer"
                raise InvalidParametersError(msg) from exc
    return qrels
