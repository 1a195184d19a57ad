"""Multifield BM25 (BEIR's Elasticsearch best_fields, tie_breaker 0.5): per-field tables, scores, upkeep.

Scores are checked against BM25 computed by hand (tests/backends/contract/bm25_reference.py), the way FTS5
computes it on a one-column table. Every text is lowercase words that the Porter stemmer leaves distinct.
"""

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.backends.sqlite.store import (
    SqliteStore,
    content_fts_table,
    fts_table,
    match_expression,
    sqlite_connection,
    title_fts_table,
    vocabulary_table,
)
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from iris_rag.stores.base import COLLECTION_ID, ChunkInput, DocumentInput, KeywordQuery
from iris_rag.stores.filters import MetadataFilter, parse_filters
from iris_rag.techniques.hybrid_ifind import HybridParams
from tests.backends.contract.bm25_reference import hand_bm25, hand_multifield

DIM = 8

# id → (title, content, metadata). One chunk each. "g" has no title: it has no row in the title table.
CORPUS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "a": ("alpha", "one two three four five six seven eight nine ten", {"year": 2020}),
    "b": ("gamma delta epsilon", "alpha one two three", {"year": 2021}),
    "c": ("alpha beta gamma", "beta beta one two", {"year": 2022}),
    "d": ("delta epsilon zeta", "four five six", {"year": 2020}),
    "e": ("eta theta iota", "seven eight nine beta", {"year": 2021}),
    "f": ("kappa lambda mu", "ten one two", {"year": 2022}),
    "g": ("", "alpha two", {"year": 2021}),
}


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _document(doc_id: str, title: str, content: str, metadata: dict[str, Any] | None = None) -> DocumentInput:
    chunk = ChunkInput(0, content, 0, len(content), _vector(len(doc_id)))
    return DocumentInput(doc_id, title, content, metadata or {}, [chunk])


def _store(path: Path, corpus: dict[str, tuple[str, str, dict[str, Any]]] = CORPUS) -> SqliteStore:
    store = SqliteStore(path)
    store.create_collection("c", "model-a", DIM)
    store.upsert_documents("c", [_document(i, t, c, m) for i, (t, c, m) in corpus.items()])
    return store


def multifield(
    store: SqliteStore,
    terms: list[str],
    title_weight: float = 1.0,
    metadata_filter: MetadataFilter | None = None,
) -> dict[str, float]:
    query = KeywordQuery.of(terms, title_weight, "multifield")
    hits = store.keyword_search("c", query, 100, metadata_filter)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    return {h.chunk_id: h.score for h in hits}


def _approx(expected: dict[str, float]) -> Any:
    return {key: pytest.approx(value, rel=1e-9) for key, value in expected.items()}


@pytest.mark.parametrize("terms", [["alpha"], ["beta"], ["alpha", "beta"], ["alpha", "two"]])
@pytest.mark.parametrize("title_weight", [1.0, 3.0])
def test_multifield_scores_are_per_field_bm25_best_plus_half_the_other(
    tmp_path: Path, terms: list[str], title_weight: float
) -> None:
    store = _store(tmp_path / "db.sqlite3")
    expected = hand_multifield(CORPUS, terms, title_weight)
    assert multifield(store, terms, title_weight=title_weight) == _approx(expected)


def test_combination_is_max_plus_half_min_not_a_sum_or_the_best_field(tmp_path: Path) -> None:
    # "c" matches both fields: its score is neither their sum nor the better one alone.
    store = _store(tmp_path / "db.sqlite3")
    title = hand_bm25({i: t for i, (t, _, _) in CORPUS.items() if t}, ["beta"])["c"]
    content = hand_bm25({i: c for i, (_, c, _) in CORPUS.items()}, ["beta"])["c"]
    score = multifield(store, ["beta"])["c#0"]
    assert score == pytest.approx(max(title, content) + 0.5 * min(title, content), rel=1e-9)
    assert score != pytest.approx(title + content, rel=1e-3)
    assert score != pytest.approx(max(title, content), rel=1e-3)


def test_flat_is_the_default_and_is_fts5_bm25_over_both_columns(tmp_path: Path) -> None:
    store = _store(tmp_path / "db.sqlite3")
    default = store.keyword_search("c", KeywordQuery.of(["alpha", "beta"], 2.0), 100)
    assert default == store.keyword_search("c", KeywordQuery.of(["alpha", "beta"], 2.0, "flat"), 100)
    match = match_expression(KeywordQuery.of(["alpha", "beta"]))
    table = fts_table("c")
    rows = (
        sqlite_connection(store)
        .execute(
            f"SELECT k.chunk_id, -bm25({table}, 2.0, 1.0) FROM {table} "
            f"JOIN chunks k ON k.rowid = {table}.rowid WHERE {table} MATCH ?",
            (match,),
        )
        .fetchall()
    )
    assert {h.chunk_id: h.score for h in default} == {row[0]: row[1] for row in rows}
    assert {h.chunk_id: h.score for h in default} != _approx(hand_multifield(CORPUS, ["alpha", "beta"], 2.0))


def test_keyword_scoring_changes_the_ranking(tmp_path: Path) -> None:
    # "short" has a one-word title on a long text; "mid" has the term once in an ordinary text. One length
    # for both fields buries the title match (flat); the title's own length normalization lifts it.
    filler = "one two three four five six seven eight nine ten eleven"
    corpus: dict[str, tuple[str, str, dict[str, Any]]] = {
        "short": ("alpha", f"{filler} {filler} {filler}", {}),
        "mid": ("gamma delta epsilon", "alpha one two three four five", {}),
        **{f"x{i}": ("zeta eta theta", "four five six seven eight nine", {}) for i in range(5)},
    }
    store = _store(tmp_path / "db.sqlite3", corpus)
    flat = store.keyword_search("c", KeywordQuery.of(["alpha"]), 10)
    multi = store.keyword_search("c", KeywordQuery.of(["alpha"], scoring="multifield"), 10)
    assert [h.chunk_id for h in flat] == ["mid#0", "short#0"]
    assert [h.chunk_id for h in multi] == ["short#0", "mid#0"]
    assert {h.chunk_id: h.score for h in multi} == _approx(hand_multifield(corpus, ["alpha"]))


def test_top_k_is_the_exact_combined_top_k(tmp_path: Path) -> None:
    # Four chunks match in the title only, four in the content only, three a little less well in both:
    # the combined top 3 are the last three, which neither field's own top 3 (or top 4) holds.
    corpus: dict[str, tuple[str, str, dict[str, Any]]] = {
        **{f"t{i}": ("alpha", "one two three four five six", {}) for i in range(4)},
        **{f"c{i}": ("one two", "alpha", {}) for i in range(4)},
        **{f"both{i}": ("alpha one", "alpha one two", {}) for i in range(3)},
        **{f"x{i}": ("seven eight", "nine ten eleven", {}) for i in range(30)},
    }
    title = hand_bm25({i: t for i, (t, _, _) in corpus.items() if t}, ["alpha"])
    content = hand_bm25({i: c for i, (_, c, _) in corpus.items()}, ["alpha"])
    for field in (title, content):
        assert not any(k.startswith("both") for k in sorted(field, key=lambda k: -field[k])[:4])
    store = _store(tmp_path / "db.sqlite3", corpus)
    expected = hand_multifield(corpus, ["alpha"])
    best = sorted(expected, key=lambda chunk_id: -expected[chunk_id])[:3]
    assert sorted(best) == ["both0#0", "both1#0", "both2#0"]
    top = store.keyword_search("c", KeywordQuery.of(["alpha"], scoring="multifield"), 3)
    assert sorted(h.chunk_id for h in top) == sorted(best)
    assert [h.score for h in top] == [pytest.approx(expected[c], rel=1e-9) for c in [h.chunk_id for h in top]]


def _title_rows(store: SqliteStore) -> set[tuple[int, str]]:
    return {
        (row[0], row[1])
        for row in sqlite_connection(store).execute(f"SELECT rowid, title FROM {title_fts_table('c')}")
    }


def _expected_title_rows(store: SqliteStore) -> set[tuple[int, str]]:
    rows = sqlite_connection(store).execute(
        "SELECT k.rowid, d.title FROM chunks k JOIN documents d "
        "ON d.collection_id = k.collection_id AND d.id = k.document_id WHERE k.collection_id = 'c'"
    )
    return {(row[0], row[1]) for row in rows if row[1]}


def _check_tables(store: SqliteStore) -> None:
    """Title rows are exactly the chunks' titles; FTS5 finds both indexes consistent with their content."""
    assert _title_rows(store) == _expected_title_rows(store)
    connection = sqlite_connection(store)
    for table in (title_fts_table("c"), content_fts_table("c")):
        connection.execute(f"INSERT INTO {table} ({table}) VALUES ('integrity-check')")
    chunks = connection.execute(f"SELECT COUNT(*) FROM {content_fts_table('c')}_docsize").fetchone()[0]
    assert chunks == connection.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]


def test_field_tables_follow_replace_and_delete(tmp_path: Path) -> None:
    store = _store(tmp_path / "db.sqlite3")
    _check_tables(store)
    corpus = dict(CORPUS)
    # Replace "c" (new title and text) and "e" (its title emptied: its title row must go).
    corpus["c"] = ("omega", "beta one", {"year": 2022})
    corpus["e"] = ("", "seven eight nine beta", {"year": 2021})
    store.upsert_documents("c", [_document("c", *corpus["c"]), _document("e", *corpus["e"])])
    _check_tables(store)
    assert not any(title == "alpha beta gamma" for _, title in _title_rows(store))
    for terms in (["alpha"], ["beta"], ["omega", "beta"]):
        assert multifield(store, terms) == _approx(hand_multifield(corpus, terms))
    assert store.delete_document("c", "a")
    del corpus["a"]
    _check_tables(store)
    for terms in (["alpha"], ["beta", "ten"]):
        assert multifield(store, terms) == _approx(hand_multifield(corpus, terms))


def test_collection_from_before_the_field_tables_is_backfilled(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    store = _store(path)
    # What a store written before these tables existed looks like: the main FTS table only.
    connection = sqlite_connection(store)
    connection.execute(f"DROP TABLE {title_fts_table('c')}")
    connection.execute(f"DROP TABLE {content_fts_table('c')}")
    store.close()

    reopened = SqliteStore(path)
    assert reopened.get_collection("c") is not None
    assert multifield(reopened, ["alpha", "beta"]) == _approx(hand_multifield(CORPUS, ["alpha", "beta"]))
    _check_tables(reopened)

    # A write to such a collection builds them too, before writing its own rows.
    connection = reopened.connection()
    connection.execute(f"DROP TABLE {title_fts_table('c')}")
    connection.execute(f"DROP TABLE {content_fts_table('c')}")
    corpus = {**CORPUS, "h": ("alpha alpha", "beta", {"year": 2023})}
    reopened.upsert_documents("c", [_document("h", *corpus["h"])])
    _check_tables(reopened)
    assert multifield(reopened, ["alpha", "beta"]) == _approx(hand_multifield(corpus, ["alpha", "beta"]))


def test_field_table_names_are_quoted_and_never_another_collections_table() -> None:
    odd = 'we"ird id'
    assert title_fts_table(odd) == '"kw_776522697264206964:title"'
    assert content_fts_table(odd) == '"kw_776522697264206964:content"'
    # Ids built to collide by prefix, by FTS5's shadow-table suffixes or by letter case do not.
    ids = [
        "x",
        "x_data",
        "x_title",
        "x.title",
        "title",
        "title_x",
        "x_content",
        "x-title_data",
        "X",
        "X_DATA",
    ]
    assert all(COLLECTION_ID.match(i) for i in ids)
    shadows = ("", "_data", "_idx", "_content", "_docsize", "_config")
    tables = (fts_table, title_fts_table, content_fts_table, vocabulary_table)

    def names(collection_id: str) -> set[str]:
        return {table(collection_id)[1:-1].lower() + suffix for table in tables for suffix in shadows}

    for i in ids:
        assert len(names(i)) == len(tables) * len(shadows)
        assert all(not names(i) & names(j) for j in ids if j != i), i


def test_odd_collection_id_works(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db.sqlite3")
    store.create_collection('we"ird id', "model-a", DIM)
    store.upsert_documents('we"ird id', [_document("d", "alpha", "beta")])
    hits = store.keyword_search('we"ird id', KeywordQuery.of(["alpha"], scoring="multifield"), 5)
    assert [h.chunk_id for h in hits] == ["d#0"]


def test_filter_applies_to_both_fields(tmp_path: Path) -> None:
    store = _store(tmp_path / "db.sqlite3")
    terms = ["alpha", "beta"]
    unfiltered = hand_multifield(CORPUS, terms)
    # 2021: "b" and "g" match alpha by content only, "e" beta by content only; "a" (title only, 2020) and
    # "c" (both fields, 2022) are left out.
    allowed = multifield(store, terms, metadata_filter=parse_filters({"year": 2021}))
    assert allowed == _approx({k: v for k, v in unfiltered.items() if k in {"b#0", "e#0", "g#0"}})
    # A filter keeps the collection's statistics: the scores are the unfiltered ones.
    title_only = multifield(store, ["alpha"], metadata_filter=parse_filters({"year": {"lte": 2020}}))
    assert title_only == _approx({"a#0": hand_multifield(CORPUS, ["alpha"])["a#0"]})
    both = multifield(store, ["beta"], metadata_filter=parse_filters({"year": {"gte": 2022}}))
    assert both == _approx({"c#0": hand_multifield(CORPUS, ["beta"])["c#0"]})


def test_keyword_scoring_parameter_in_schema_and_model() -> None:
    spec = tool_spec("rag_hybrid_ifind")
    assert spec is not None
    schema = spec["inputSchema"]["properties"]["technique_params"]["properties"]["keyword_scoring"]
    assert schema["enum"] == ["flat", "multifield"]
    assert schema["default"] == HybridParams.model_fields["keyword_scoring"].default == "flat"
    with pytest.raises(ValueError, match="keyword_scoring"):
        HybridParams.model_validate({"keyword_scoring": "bm25f"})


def test_rag_hybrid_ifind_keyword_scoring(service: RagService) -> None:
    filler = "Numbers one two three four five six seven eight nine ten eleven twelve."
    documents = [
        {"id": "short", "title": "Ketamine", "content": f"{filler} {filler} {filler}"},
        {
            "id": "mid",
            "title": "Anaesthesia drugs",
            "content": "Ketamine is one of the drugs used in surgery.",
        },
        *(
            {"id": f"x{i}", "title": "Weather report", "content": "Rain and wind today again."}
            for i in range(5)
        ),
    ]
    service.ingest({"collection_id": "docs", "documents": documents})

    def run(scoring: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"vector_weight": 0.0, "keyword_weight": 1.0}
        if scoring:
            params["keyword_scoring"] = scoring
        arguments = {"query": "ketamine", "collection_id": "docs", "technique_params": params}
        arguments["options"] = {"generate": False, "top_k": 5}
        return service.execute({"technique": "hybrid_ifind", "arguments": arguments})

    default, flat, multi = run(None), run("flat"), run("multifield")
    assert [d["id"] for d in default["retrieved_documents"]] == ["mid", "short"]
    assert [d["id"] for d in flat["retrieved_documents"]] == ["mid", "short"]
    assert [d["id"] for d in multi["retrieved_documents"]] == ["short", "mid"]
    assert default["metadata"]["technique_specific"]["keyword_scoring"] == "flat"
    assert multi["metadata"]["technique_specific"]["keyword_scoring"] == "multifield"
