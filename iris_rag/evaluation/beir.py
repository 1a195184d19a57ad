"""BEIR-format datasets: corpus.jsonl, queries.jsonl (or queries_<split>.jsonl) and qrels/<split>.tsv."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.loaders import NotDecodable, SourceDocument, decoded_text

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class BeirDataset:
    """A corpus, the queries to evaluate (every query the split's qrels judge) and their judgments.

    `duplicate_ids`: corpus ids on more than one line (the last line of each is the document, as in
    BEIR's loader); `unjudged_queries`: queries in the queries file that the split does not judge.
    """

    name: str
    path: Path
    split: str
    corpus: list[SourceDocument]
    queries: dict[str, str]
    qrels: Qrels
    duplicate_ids: tuple[str, ...] = ()
    unjudged_queries: int = 0

    def limited(self, count: int) -> BeirDataset:
        """The same dataset with only its first `count` queries (a quick run)."""
        queries = dict(list(self.queries.items())[:count])
        return replace(self, queries=queries, qrels={q: self.qrels[q] for q in queries})


def load_beir(path: Path, split: str = "test") -> BeirDataset:
    """Read a BEIR folder as BEIR's GenericDataLoader does.

    Every query in the split's qrels is evaluated, also one whose judgments are all 0 (it scores 0, as
    pytrec_eval scores it in BEIR); queries the split does not judge are left out. A corpus id on several
    lines is the last of them. Files are UTF-8 (a BOM allowed), or UTF-16/32 with a BOM, as `iris-rag ingest`
    reads them.
    """
    if not path.is_dir():
        msg = f"dataset folder {str(path)!r} does not exist"
        raise InvalidParametersError(msg)
    qrels_file = _required(path / "qrels" / f"{split}.tsv")
    qrels = _read_qrels(qrels_file)
    if not any(score > 0 for docs in qrels.values() for score in docs.values()):
        # Nothing relevant anywhere: all-zero measures would read as a result.
        msg = (
            f"no judged queries in {str(qrels_file)!r} for split {split!r}: "
            "it needs query-id, corpus-id, score rows with a score above 0"
        )
        raise InvalidParametersError(msg)
    # A split may ship its own queries file (queries_train.jsonl); otherwise queries.jsonl holds them all.
    queries_file = path / f"queries_{split}.jsonl"
    queries_file = _required(queries_file if queries_file.exists() else path / "queries.jsonl")
    all_queries = {
        _record_id(queries_file, number, record): _query_text(queries_file, number, record)
        for number, record in _read_jsonl(queries_file)
    }
    unknown = qrels.keys() - all_queries.keys()
    if unknown:
        example = ", ".join(sorted(unknown)[:5])
        msg = f"{len(unknown)} judged query ids are not in {str(queries_file)!r} (e.g. {example})"
        raise InvalidParametersError(msg)
    queries = {qid: text for qid, text in all_queries.items() if qid in qrels}
    corpus_file = _required(path / "corpus.jsonl")
    corpus: dict[str, SourceDocument] = {}
    duplicates: dict[str, None] = {}
    for number, record in _read_jsonl(corpus_file):
        document_id = _record_id(corpus_file, number, record)
        if document_id in corpus:
            duplicates[document_id] = None
        corpus[document_id] = _corpus_document(corpus_file, number, record, document_id)
    if not any(document.content.strip() for document in corpus.values()):
        msg = f"no document in {str(corpus_file)!r} has text (its 'text' and 'title' are all empty)"
        raise InvalidParametersError(msg)
    return BeirDataset(
        path.resolve().name,
        path,
        split,
        list(corpus.values()),
        queries,
        {q: qrels[q] for q in queries},
        tuple(duplicates),
        len(all_queries) - len(queries),
    )


def _corpus_document(path: Path, number: int, record: dict[str, Any], document_id: str) -> SourceDocument:
    title = record.get("title")
    if title is not None and not isinstance(title, str):
        msg = f"{path}:{number}: 'title' must be a string, not {_json_type(title)}"
        raise InvalidParametersError(msg)
    text = _string_field(path, number, record, "text")
    title, text = (title or "").strip(), text.strip()
    # BEIR encodes title + text, so a title-only record is still searchable; the ingestor needs content.
    return SourceDocument(id=document_id, content=text or title, title=title)


def _query_text(path: Path, number: int, record: dict[str, Any]) -> str:
    text = _string_field(path, number, record, "text")
    if not text.strip():
        msg = f"{path}:{number}: the query's 'text' is empty"
        raise InvalidParametersError(msg)
    return text


def _string_field(path: Path, number: int, record: dict[str, Any], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        found = "no" if name not in record else _json_type(value)
        msg = f"{path}:{number}: expected a string {name!r}, found {found}"
        raise InvalidParametersError(msg)
    return value


def _record_id(path: Path, number: int, record: dict[str, Any]) -> str:
    """The record's `_id`: a string, or an integer as some BEIR exports write numeric ids."""
    value = record["_id"]
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    msg = f"{path}:{number}: '_id' must be a string or an integer, not {_json_type(value)}"
    raise InvalidParametersError(msg)


def _json_type(value: object) -> str:
    names = {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a decimal number",
        list: "an array",
    }
    return names.get(type(value), "an object" if isinstance(value, dict) else type(value).__name__)


def _required(path: Path) -> Path:
    if not path.is_file():
        msg = f"missing {str(path)!r}: not a BEIR folder, or no such split"
        raise InvalidParametersError(msg)
    return path


def _text(path: Path) -> str:
    """The file's text, decoded as `iris-rag ingest` decodes it."""
    try:
        return decoded_text(path.read_bytes())
    except NotDecodable as exc:
        msg = f"{path}: {exc}"
        raise InvalidParametersError(msg) from None


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Each record with its line number."""
    records: list[tuple[int, dict[str, Any]]] = []
    # On "\n" only: U+2028, U+2029 and U+0085 may stand unescaped inside a JSON string.
    for number, line in enumerate(_text(path).split("\n"), start=1):
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
        records.append((number, record))
    return records


def _read_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    reader = csv.reader(io.StringIO(_text(path), newline=""), delimiter="\t")
    for row in reader:
        number = reader.line_num
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
