"""Structured tables: type inference, CSV and JSON-lines reading, one-transaction replace, documents views."""

import sqlite3
from pathlib import Path

import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.errors import InvalidParametersError
from iris_rag.service import RagService
from iris_rag.techniques.sqlrag.pipeline import SqlRagPipeline
from iris_rag.techniques.sqlrag.storage import StructuredTableStorage
from iris_rag.techniques.sqlrag.tables import (
    build_table,
    classify,
    ensure_view,
    infer_type,
    parse_csv,
    parse_json_lines,
    parse_records,
    read_table_file,
    unique_names,
)
from tests.conftest import DOCUMENTS

SALES_CSV = (
    "Region,Amount,Sold On,Zip,Paid,Note,Stamp\n"
    "north,10.5,2024-01-02,02134,true,first,2024-01-02T10:00:00\n"
    "south,7,2024-02-03,10001,false,,2024-02-03 11:30\n"
    'north,3,2024-03-01,,TRUE,"multi, comma",2024-03-01\n'
)


def sqlrag(service: RagService) -> SqlRagPipeline:
    pipeline = service.pipelines["sqlrag"]
    assert isinstance(pipeline, SqlRagPipeline)
    return pipeline


def tables(service: RagService) -> StructuredTableStorage:
    return service.store.technique_storage(StructuredTableStorage)


def sqlite_file(service: RagService) -> sqlite3.Connection:
    """The store's own connection, for checks of what SQLite really holds."""
    store = service.store
    assert isinstance(store, SqliteStore)
    return store.connection()


def test_csv_column_types_are_inferred_and_cells_converted() -> None:
    columns, rows = build_table(parse_csv(SALES_CSV))
    assert [(c.name, c.source, c.type) for c in columns] == [
        ("region", "Region", "TEXT"),
        ("amount", "Amount", "REAL"),  # 10.5 and 7: a REAL column
        ("sold_on", "Sold On", "DATE"),
        ("zip", "Zip", "TEXT"),  # '02134' keeps its leading zero
        ("paid", "Paid", "BOOLEAN"),
        ("note", "Note", "TEXT"),
        ("stamp", "Stamp", "DATETIME"),  # dates and date-times mixed
    ]
    assert rows[0] == ["north", 10.5, "2024-01-02", "02134", 1, "first", "2024-01-02T10:00:00"]
    assert rows[1][1] == 7.0 and rows[1][4] == 0 and rows[1][5] is None, "an empty cell is NULL"
    assert rows[2][3] is None and rows[2][4] == 1 and rows[2][5] == "multi, comma"


def test_json_values_keep_their_types() -> None:
    text = "\n".join(
        [
            '{"id": 1, "score": 2, "flag": true, "day": "2024-05-01", "code": "42", "tags": ["a"], "mix": 1}',
            '{"id": 2, "score": 2.5, "flag": false, "day": "2024-05-02", "code": "7", "tags": {"k": 1}, '
            '"mix": "x"}',
            "",
            '{"id": 3, "extra": "only here"}',
        ]
    )
    raw = parse_json_lines(text)
    assert raw.headers == ["id", "score", "flag", "day", "code", "tags", "mix", "extra"]
    columns, rows = build_table(raw)
    assert {c.name: c.type for c in columns} == {
        "id": "INTEGER",
        "score": "REAL",
        "flag": "BOOLEAN",
        "day": "DATE",
        "code": "TEXT",  # a JSON string stays text even when it looks like a number
        "tags": "JSON",
        "mix": "TEXT",
        "extra": "TEXT",
    }
    assert rows[0] == [1, 2.0, 1, "2024-05-01", "42", '["a"]', "1", None]
    assert rows[2] == [3, None, None, None, None, None, None, "only here"], "a missing key is NULL"


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("-5", "INTEGER"),
        ("1e3", "REAL"),
        ("0.25", "REAL"),
        ("00.5", "TEXT"),
        ("2024-02-30", "TEXT"),  # not a real date
        ("2024-02-29", "DATE"),
        ("2024-02-29T23:59:59Z", "DATETIME"),
        (str(2**70), "TEXT"),  # past 64-bit integers
        ("nan", "TEXT"),
        ("False", "BOOLEAN"),
        ("   ", None),
    ],
)
def test_classify_text_cells(cell: str, expected: str | None) -> None:
    assert classify(cell, typed=False) == expected


def test_type_merging() -> None:
    assert infer_type(["1", "2", ""], typed=False) == "INTEGER"
    assert infer_type(["1", "2.5"], typed=False) == "REAL"
    assert infer_type(["1", "true"], typed=False) == "TEXT"
    assert infer_type(["", None], typed=False) == "TEXT", "a column with no values is TEXT"


def test_column_names_are_plain_identifiers() -> None:
    assert unique_names(["Unit Price ($)", "order", "1st", "a b", "A_B", "Größe"]) == [
        "unit_price",
        "order_",
        "c_1st",
        "a_b",
        "a_b_2",
        "größe",
    ]
    raw = parse_csv("name,,name\nx,y,z\n")
    assert unique_names(raw.headers) == ["name", "column_2", "name_2"]


def test_delimiters_and_malformed_sources(tmp_path: Path) -> None:
    assert parse_csv("a;b\n1;2\n").rows == [["1", "2"]]
    tsv = tmp_path / "t.tsv"
    tsv.write_text("a\tb,c\n1\t2,3\n", encoding="utf-8")
    assert read_table_file(tsv).rows == [["1", "2,3"]]
    with pytest.raises(InvalidParametersError, match="line 3: 3 fields"):
        parse_csv("a,b\n1,2\n1,2,3\n")
    with pytest.raises(InvalidParametersError, match="empty"):
        parse_csv("\n\n")
    # An unclosed quote would swallow the rest of the file into one cell: refused, naming where it opened.
    for unclosed, line in [('a,"b\n1,2\n', 1), ('a,b\n1,2\n3,"four\n5,6\n7,8\n', 3)]:
        with pytest.raises(InvalidParametersError, match=f"line {line}: a quoted field is never closed"):
            parse_csv(unclosed)
    assert parse_csv('a,b\n1,"two, ""quoted""\nlines"\n').rows == [["1", 'two, "quoted"\nlines']]
    with pytest.raises(InvalidParametersError, match="line 2"):
        parse_json_lines('{"a": 1}\n[1, 2]\n')
    with pytest.raises(InvalidParametersError, match="record 2"):
        parse_records([{"a": 1}, "not an object"])
    with pytest.raises(InvalidParametersError, match="no rows"):
        build_table(parse_csv("a,b\n"))
    with pytest.raises(InvalidParametersError, match="unsupported"):
        read_table_file(tmp_path / "x.xlsx")
    assert parse_json_lines('[{"a": 1}, {"b": 2}]').headers == ["a", "b"]


def test_ingest_creates_a_real_typed_table_and_registers_it(service: RagService, tmp_path: Path) -> None:
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    path = tmp_path / "sales.csv"
    path.write_text(SALES_CSV, encoding="utf-8")
    result = sqlrag(service).ingest_table_file(path, "Sales", "docs")
    assert result["sql_name"] == "t_sales" and result["row_count"] == 3 and result["replaced"] is False
    connection = sqlite_file(service)
    declared = {row[1]: row[2] for row in connection.execute('PRAGMA table_info("t_sales")')}
    assert declared == {
        "region": "TEXT",
        "amount": "REAL",
        "sold_on": "TEXT",
        "zip": "TEXT",
        "paid": "INTEGER",
        "note": "TEXT",
        "stamp": "TEXT",
    }
    total = connection.execute("SELECT sum(amount) FROM t_sales WHERE region = 'north'").fetchone()[0]
    assert total == 13.5
    info = tables(service).get_table("t_sales")
    assert info is not None
    assert (info.kind, info.collection_id, info.row_count, info.source) == ("table", "docs", 3, "sales.csv")
    assert {t.name for t in tables(service).list_tables()} == {"t_sales", "documents_docs"}


def test_reingest_replaces_the_table_in_one_transaction(service: RagService) -> None:
    pipeline = sqlrag(service)
    first = pipeline.ingest_table({"table": "scores", "rows": [{"who": "a", "points": 1}, {"who": "b"}]})
    created = tables(service).get_table("t_scores")
    assert first["replaced"] is False and created is not None
    second = pipeline.ingest_table({"table": "scores", "csv": "team,total,day\nx,3.5,2024-01-01\n"})
    assert second["replaced"] is True
    connection = sqlite_file(service)
    assert [tuple(r) for r in connection.execute("SELECT * FROM t_scores")] == [("x", 3.5, "2024-01-01")]
    replaced = tables(service).get_table("t_scores")
    assert replaced is not None
    assert [c.name for c in replaced.columns] == ["team", "total", "day"]
    assert replaced.created_at == created.created_at and replaced.row_count == 1

    # A failure inside the transaction (the name is taken by a table that is not structured data)
    # rolls everything back: the other table keeps its rows, nothing is registered.
    connection.execute("CREATE TABLE t_foreign (x)")
    connection.execute("INSERT INTO t_foreign VALUES (42)")
    with pytest.raises(InvalidParametersError, match="not a structured table"):
        pipeline.ingest_table({"table": "foreign", "rows": [{"y": 1}]})
    assert connection.execute("SELECT x FROM t_foreign").fetchall()[0][0] == 42
    assert tables(service).get_table("t_foreign") is None
    assert not connection.in_transaction


def test_documents_view_follows_ingest(service: RagService) -> None:
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    connection = sqlite_file(service)
    view = tables(service).view_for("docs")
    assert view is not None and view.name == "documents_docs"
    assert [(c.name, c.type) for c in view.columns] == [
        ("id", "TEXT"),
        ("title", "TEXT"),
        ("created_at", "DATETIME"),
        ("updated_at", "DATETIME"),
        ("year", "INTEGER"),
        ("topic", "TEXT"),
    ]
    rows = connection.execute("SELECT id, year FROM documents_docs WHERE topic = 'geology'").fetchall()
    assert [tuple(r) for r in rows] == [("volcano", 2021)]

    extra = {
        "id": "late",
        "content": "A later document with new metadata.",
        "metadata": {"journal": "Nature", "year": 2023.5, "title": "clash"},
    }
    service.ingest({"collection_id": "docs", "documents": [extra]})
    view = tables(service).view_for("docs")
    assert view is not None
    columns = {c.name: (c.source, c.type) for c in view.columns}
    assert columns["journal"] == ("journal", "TEXT")
    assert columns["year"] == ("year", "REAL"), "2019 and 2023.5: the type widens"
    assert columns["title_2"] == ("title", "TEXT"), "a metadata key named like a base column is renamed"
    row = connection.execute(
        "SELECT journal, title, title_2 FROM documents_docs WHERE id = 'late'"
    ).fetchone()
    assert tuple(row) == ("Nature", "", "clash")
    assert view.row_count == 4


def test_views_are_built_for_older_collections_and_never_collide(service: RagService) -> None:
    service.ingest({"collection_id": "a-b", "documents": DOCUMENTS[:1]})
    service.ingest({"collection_id": "a_b", "documents": DOCUMENTS[1:2]})
    connection = sqlite_file(service)
    first, second = tables(service).view_for("a-b"), tables(service).view_for("a_b")
    assert first is not None and second is not None
    assert (first.name, second.name) == ("documents_a_b", "documents_a_b_2")

    # As if the collection had been ingested before rag_sqlrag existed: no view, no registry row.
    connection.execute("DROP VIEW documents_a_b")
    connection.execute("DELETE FROM structured_tables WHERE name = 'documents_a_b'")
    index = sqlrag(service).technique_index()
    assert index.indexed_documents("a-b") == 1, "never stale: the view is built on first use"
    assert "sqlrag" not in service.stale_indexes("a-b")
    assert tables(service).view_for("a-b") is None
    rebuilt = ensure_view(tables(service), "a-b")
    assert [c.name for c in rebuilt.columns][-2:] == ["year", "topic"]
    assert connection.execute(f"SELECT id FROM {rebuilt.name}").fetchall()[0][0] == "aspirin"
    assert index.stats() == {"tables": 0, "documents_views": 2}
