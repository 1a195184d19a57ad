"""rag_sqlrag on a real store and model: where the SQL comes from, every parameter, the tools and the CLI."""

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from iris_rag.access import Principal
from iris_rag.cli import build_parser, cmd_ingest_table
from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError, SqlRejectedError
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.sqlrag.pipeline import SQL_DOCUMENT_ID, SqlRagPipeline, extract_sql
from iris_rag.techniques.sqlrag.safety import MAX_RESULT_BYTES
from iris_rag.worker.dispatch import Dispatcher
from tests.conftest import DOCUMENTS, raise_unwritable_store
from tests.fake_openai import FakeOpenAIServer

SALES = [
    {"region": "north", "amount": 10.5, "sold_on": "2024-01-02"},
    {"region": "south", "amount": 7, "sold_on": "2024-02-03"},
    {"region": "north", "amount": 3, "sold_on": "2024-03-01"},
    {"region": "east", "amount": 1, "sold_on": "2024-03-05"},
]
TOTALS = "SELECT region, sum(amount) AS total FROM t_sales GROUP BY region ORDER BY total DESC"


def pipeline_of(service: RagService) -> SqlRagPipeline:
    pipeline = service.pipelines["sqlrag"]
    assert isinstance(pipeline, SqlRagPipeline)
    return pipeline


def load_tables(service: RagService) -> RagService:
    """docs (3 documents) with t_sales; t_rates shared by every collection; t_other in collection notes."""
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    service.ingest({"collection_id": "notes", "documents": [{"id": "n", "content": "A note about tides."}]})
    pipeline = pipeline_of(service)
    pipeline.ingest_table({"table": "sales", "collection_id": "docs", "rows": SALES})
    pipeline.ingest_table({"table": "rates", "csv": "region,rate\nnorth,0.2\nsouth,0.1\n"})
    pipeline.ingest_table({"table": "other", "collection_id": "notes", "rows": [{"x": 1}]})
    return service


@pytest.fixture
def sql_service(service: RagService) -> RagService:
    return load_tables(service)


def sqlrag(
    service: RagService,
    query: str = "Which region sold the most?",
    params: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    arguments: dict[str, Any] = {"query": query, "collection_id": "docs", "technique_params": params or {}}
    if options:
        arguments["options"] = options
    return service.execute({"technique": "sqlrag", "arguments": arguments})


def specific(result: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = result["metadata"]["technique_specific"]
    return value


def ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


def test_caller_sql_rows_are_passage_one_and_come_back_with_the_sql(sql_service: RagService) -> None:
    result = sqlrag(sql_service, params={"sql": TOTALS})
    report = specific(result)
    assert report["sql_source"] == "caller" and report["sql_status"] == "executed"
    assert report["columns"] == ["region", "total"]
    assert report["rows"] == [["north", 13.5], ["south", 7.0], ["east", 1.0]]
    assert report["sql"] == TOTALS
    assert report["executed_sql"].endswith("LIMIT 101")
    assert report["tables_used"] == ["t_sales"]
    assert report["tables_in_scope"] == ["t_rates", "t_sales", "documents_docs"]
    first = result["retrieved_documents"][0]
    assert first["id"] == SQL_DOCUMENT_ID and first["source"] == "sql" and first["similarity_score"] == 1.0
    assert "| north | 13.5 |" in first["content"]
    answer = result["answer"]
    assert answer.startswith("From the table rows [1]")
    assert "| north | 13.5 |" in answer and "| east | 1.0 |" in answer
    assert "SQL: SELECT region" in answer
    # The dense passages follow, cited from [2]; none of them is about sales, and the answer says so.
    assert "Nothing relevant was found" in answer and "[2]" in answer
    assert result["metadata"]["answer_source"] == "extractive"


def test_without_llm_or_sql_the_error_carries_the_schema(sql_service: RagService) -> None:
    with pytest.raises(InvalidParametersError) as caught:
        sqlrag(sql_service)
    details = caught.value.details
    assert details["reason"] == "no_llm"
    assert "technique_params.sql is required" in caught.value.message
    tables = {t["name"]: t for t in details["schema"]}
    assert set(tables) == {"t_sales", "t_rates", "documents_docs"}
    columns = {c["name"]: c for c in tables["t_sales"]["columns"]}
    assert columns["amount"]["type"] == "REAL" and columns["sold_on"]["type"] == "DATE"
    assert columns["region"]["samples"] == ["north", "south", "east"]
    assert details["rules"]["dialect"] == "sqlite"


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(
        reply="```sql\nSELECT region, sum(amount) AS total FROM t_sales GROUP BY region;\n```"
    )
    yield server
    server.close()


@pytest.fixture
def llm_service(tmp_path: Path, embedder: Embedder, fake_llm: FakeOpenAIServer) -> Iterator[RagService]:
    settings = Settings(
        RAG_DATA_DIR=tmp_path / "llm",
        **fake_llm.llm_settings(),
    )
    service = RagService(settings, embedder=embedder)
    load_tables(service)
    fake_llm.requests.clear()  # other techniques' indexes may call the LLM while documents are ingested
    yield service
    service.close()


def test_the_llm_writes_the_sql_from_the_schema(llm_service: RagService, fake_llm: FakeOpenAIServer) -> None:
    result = sqlrag(llm_service, "Total sales per region?", generate=False)
    report = specific(result)
    assert report["sql_source"] == "llm"
    assert report["sql"] == "SELECT region, sum(amount) AS total FROM t_sales GROUP BY region"
    assert sorted(report["rows"]) == [["east", 1.0], ["north", 13.5], ["south", 7.0]]
    assert report["llm_attempts"] == [{"sql": report["sql"], "rejected": None}]
    prompt = fake_llm.requests[0]["body"]["messages"]
    assert "Total sales per region?" in prompt[1]["content"]
    assert "t_sales (4 rows" in prompt[1]["content"] and "amount REAL" in prompt[1]["content"]
    assert "at most 3 joins" in prompt[0]["content"], "the complexity level is in the prompt"
    assert len(fake_llm.requests) == 1 and result["answer"] is None

    with pytest.raises(InvalidParametersError) as caught:
        sqlrag(llm_service, params={"enable_sql_generation": False})
    assert caught.value.details["reason"] == "generation_disabled"
    assert len(fake_llm.requests) == 1, "generation disabled: the LLM was not asked"


def test_the_llm_answer_sees_the_rows_as_passage_one(
    llm_service: RagService, fake_llm: FakeOpenAIServer
) -> None:
    result = sqlrag(llm_service, "Total sales per region?")
    assert result["metadata"]["answer_source"] == "llm"
    context = fake_llm.requests[-1]["body"]["messages"][1]["content"]
    assert context.startswith('Context:\n<passage id="1" title="Table rows: t_sales">\nSQL: SELECT region')
    assert "| north | 13.5 |" in context and '<passage id="2" ' in context


def test_a_rejected_llm_statement_gets_one_more_try(
    llm_service: RagService, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.reply = "SELECT content FROM chunks"
    with pytest.raises(SqlRejectedError) as caught:
        sqlrag(llm_service, generate=False)
    assert len(fake_llm.requests) == 2
    assert (
        "was rejected (table 'chunks' is internal" in fake_llm.requests[1]["body"]["messages"][1]["content"]
    )
    details = caught.value.details
    assert [a["sql"] for a in details["attempts"]] == ["SELECT content FROM chunks"] * 2
    assert {t["name"] for t in details["schema"]} == {"t_sales", "t_rates", "documents_docs"}


def test_an_llm_failure_asks_the_caller_for_sql(llm_service: RagService, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.status = 500
    with pytest.raises(InvalidParametersError) as caught:
        sqlrag(llm_service, generate=False)
    assert caught.value.details["reason"] == "llm_failed" and "schema" in caught.value.details
    result = sqlrag(llm_service, params={"sql": TOTALS}, generate=False)
    assert specific(result)["sql_source"] == "caller", "caller SQL needs no LLM"


@pytest.mark.parametrize("reply", ["", "  ", None, "```sql\n```"])
def test_an_empty_llm_reply_asks_the_caller_for_sql(
    llm_service: RagService, fake_llm: FakeOpenAIServer, reply: str | None
) -> None:
    """No statement written is the LLM failing to write one (as an outright failure), not SQL_REJECTED."""
    fake_llm.reply = reply
    fake_llm.finish_reason = "length"
    with pytest.raises(InvalidParametersError) as caught:
        sqlrag(llm_service, generate=False)
    assert caught.value.details["reason"] == "llm_failed" and "schema" in caught.value.details
    assert "the LLM failed to write it" in caught.value.message
    blank = not (reply or "").strip()
    assert ('finish_reason "length"' in caught.value.message) == blank, "a fenced block is text, yet no SQL"
    assert len(fake_llm.requests) == 1, "an empty reply is not retried as a rejected statement"


def test_a_reply_that_is_not_a_chat_completion_names_the_llm(
    llm_service: RagService, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.raw_reply = ("text/html", "<html><body>Please log in</body></html>")
    with pytest.raises(InvalidParametersError) as caught:
        sqlrag(llm_service, generate=False)
    message = caught.value.message
    assert "the LLM failed to write it" in message and "AttributeError" not in message
    assert f"the LLM at {fake_llm.base_url}" in message and "not a chat completion" in message
    assert "content-type text/html" in message and "Please log in" in message


def test_the_rows_sent_to_the_llm_fit_the_context_budget(
    tmp_path: Path, embedder: Embedder, fake_llm: FakeOpenAIServer
) -> None:
    """A wide result is rendered up to LLM_CONTEXT_CHARS, the rest counted; all rows stay in metadata."""
    settings = Settings(RAG_DATA_DIR=tmp_path / "budget", LLM_CONTEXT_CHARS=4000, **fake_llm.llm_settings())
    service = RagService(settings, embedder=embedder)
    try:
        load_tables(service)
        wide = [{"id": i, **{f"c{c}": f"value {i}-{c} " * 10 for c in range(5)}} for i in range(200)]
        pipeline_of(service).ingest_table({"table": "wide", "collection_id": "docs", "rows": wide})
        fake_llm.reply = "Many rows [1]."
        result = sqlrag(service, "list", {"sql": "SELECT * FROM t_wide", "max_rows": 200})
        user = fake_llm.requests[-1]["body"]["messages"][1]["content"]
        assert len(user) < 4000 + 500, "the prompt holds the passages' budget and its own few words"
        sent = re.search(r"rows sent to the LLM: (\d+) of 200", user)
        assert sent is not None and 0 < int(sent[1]) < 200
        assert len(re.findall(r"^\| \d+ \|", user, re.MULTILINE)) == int(sent[1]), "one line a row sent"
        assert len(specific(result)["rows"]) == 200
        assert result["metadata"]["generation"]["passages_sent"] >= 1
    finally:
        service.close()


def test_combine_with_vector(sql_service: RagService) -> None:
    combined = sqlrag(sql_service, "volcano lava", {"sql": TOTALS}, top_k=3)
    assert ids(combined)[:2] == [SQL_DOCUMENT_ID, "volcano"]
    assert len(ids(combined)) == 3, "the rows take one of the top_k slots"
    assert specific(combined)["vector_candidates"] == 2
    alone = sqlrag(sql_service, "volcano lava", {"sql": TOTALS, "combine_with_vector": False}, top_k=3)
    assert ids(alone) == [SQL_DOCUMENT_ID]
    assert specific(alone)["vector_candidates"] == 0 and alone["performance"]["documents_searched"] == 0
    assert "Extractive answer" not in alone["answer"]
    exact_only = sqlrag(sql_service, "volcano lava", {"sql": TOTALS}, top_k=3, min_similarity=0.99)
    assert ids(exact_only) == [SQL_DOCUMENT_ID], "min_similarity drops chunks; the rows (score 1.0) stay"
    hidden = sqlrag(sql_service, "volcano lava", {"sql": TOTALS}, include_sources=False)
    assert hidden["retrieved_documents"] == [] and specific(hidden)["row_count"] == 3


def test_filters_apply_to_the_vector_leg(sql_service: RagService) -> None:
    result = sqlrag(sql_service, "volcano bread aspirin", {"sql": TOTALS}, top_k=5, filters={"topic": "food"})
    assert ids(result) == [SQL_DOCUMENT_ID, "sourdough"]
    assert result["metadata"]["filters"]["matched_documents"] == 1


def test_generate_false_returns_the_evidence_only(sql_service: RagService) -> None:
    result = sqlrag(sql_service, params={"sql": TOTALS}, generate=False)
    assert result["answer"] is None and specific(result)["row_count"] == 3


def test_allowed_tables_cannot_reach_another_collection(sql_service: RagService) -> None:
    """Issue 11, defect 12: naming collection notes' tables in allowed_tables from docs reads nothing."""
    for names, sql in (
        (["documents_notes"], "SELECT id FROM documents_notes"),
        (["other"], "SELECT * FROM t_other"),
        (["t_other", "sales"], "SELECT * FROM t_other"),
    ):
        with pytest.raises(InvalidParametersError, match="cannot read") as caught:
            sqlrag(sql_service, params={"sql": sql, "allowed_tables": names})
        assert caught.value.details["unknown"] == [n for n in names if n != "sales"]
        assert "t_other" not in caught.value.details["queryable"]
        assert "documents_notes" not in caught.value.details["queryable"]
    # Without allowed_tables the statement is refused too, before it runs.
    with pytest.raises(SqlRejectedError):
        sqlrag(sql_service, params={"sql": "SELECT id FROM documents_notes"})


def test_allowed_tables(sql_service: RagService) -> None:
    with pytest.raises(SqlRejectedError, match="not in allowed_tables"):
        sqlrag(sql_service, params={"sql": "SELECT * FROM t_other"})
    rates = sqlrag(sql_service, params={"sql": "SELECT count(*) FROM t_rates", "allowed_tables": ["rates"]})
    assert specific(rates)["rows"] == [[2]] and specific(rates)["tables_in_scope"] == ["t_rates"]
    with pytest.raises(SqlRejectedError, match="not in allowed_tables"):
        sqlrag(sql_service, params={"sql": "SELECT id FROM documents_docs", "allowed_tables": ["t_sales"]})
    with pytest.raises(InvalidParametersError, match=r"cannot read .*: nope") as caught:
        sqlrag(sql_service, params={"sql": TOTALS, "allowed_tables": ["nope"]})
    assert "t_sales" in caught.value.details["queryable"]
    joined = (
        "SELECT s.region, round(sum(s.amount * r.rate), 2) AS tax FROM t_sales s "
        "JOIN t_rates r ON r.region = s.region GROUP BY s.region ORDER BY s.region"
    )
    assert specific(sqlrag(sql_service, params={"sql": joined}))["rows"] == [["north", 2.7], ["south", 0.7]]


def test_max_sql_complexity(sql_service: RagService) -> None:
    joined = "SELECT s.region, r.rate FROM t_sales s JOIN t_rates r ON r.region = s.region"
    with pytest.raises(SqlRejectedError, match="1 join; max_sql_complexity 'simple'"):
        sqlrag(sql_service, params={"sql": joined, "max_sql_complexity": "simple"})
    assert specific(sqlrag(sql_service, params={"sql": joined}))["complexity"]["joins"] == 1
    counting = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) SELECT sum(i) FROM n"
    )
    with pytest.raises(SqlRejectedError, match="a recursive CTE; max_sql_complexity 'moderate'"):
        sqlrag(sql_service, params={"sql": counting})
    result = sqlrag(sql_service, params={"sql": counting, "max_sql_complexity": "complex"})
    assert specific(result)["rows"] == [[15]] and specific(result)["complexity"]["recursive"] is True


def test_max_rows_and_the_query_limit(sql_service: RagService) -> None:
    everything = "SELECT region, amount FROM t_sales ORDER BY amount DESC"
    cut = specific(sqlrag(sql_service, params={"sql": everything, "max_rows": 2}))
    assert cut["rows"] == [["north", 10.5], ["south", 7.0]] and cut["truncated"] is True
    assert (cut["row_limit"], cut["query_limit"]) == (2, None)
    own = specific(sqlrag(sql_service, params={"sql": everything + " LIMIT 1", "max_rows": 2}))
    assert own["row_count"] == 1 and own["truncated"] is False and own["query_limit"] == 1
    bigger = specific(sqlrag(sql_service, params={"sql": everything + " LIMIT 3", "max_rows": 2}))
    assert bigger["row_count"] == 2 and bigger["truncated"] is True
    answer = sqlrag(sql_service, params={"sql": everything, "max_rows": 2})["answer"]
    assert "more rows matched (raise max_rows)" in answer


def test_the_result_size_is_capped_whatever_the_row_count(sql_service: RagService) -> None:
    """The security tester's statement: megabyte values from no table, rows without end (max_rows 600)."""
    flood = (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
        "SELECT printf('%999999c', 'x') AS v FROM r"
    )
    params = {"sql": flood, "combine_with_vector": False, "max_rows": 30, "max_sql_complexity": "complex"}
    result = sqlrag(sql_service, params=params)
    report = specific(result)
    assert 0 < report["row_count"] < 30 and report["truncated"] is True
    assert report["truncated_by"] == "max_result_bytes" and report["max_result_bytes"] == MAX_RESULT_BYTES
    assert len(json.dumps(result)) < MAX_RESULT_BYTES + 100_000
    assert "result size limit" in result["answer"]


def test_timeout_ms(sql_service: RagService) -> None:
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    started = time.perf_counter()
    with pytest.raises(SqlRejectedError, match="100 ms time limit") as caught:
        sqlrag(sql_service, params={"sql": forever, "max_sql_complexity": "complex", "timeout_ms": 100})
    assert time.perf_counter() - started < 5
    assert caught.value.details["stage"] == "execution"
    assert caught.value.details["sql"] == forever


def test_without_tables_the_vector_leg_answers_alone(loaded_service: RagService) -> None:
    """A collection with no structured tables (SciFact's case): no SQL is written, dense retrieval answers."""
    query = "lava from volcanoes"
    result = sqlrag(loaded_service, query, top_k=3)
    basic = loaded_service.execute(
        {
            "technique": "basic",
            "arguments": {"query": query, "collection_id": "docs", "options": {"top_k": 3}},
        }
    )
    assert ids(result) == ids(basic)
    assert [d["similarity_score"] for d in result["retrieved_documents"]] == [
        d["similarity_score"] for d in basic["retrieved_documents"]
    ]
    report = specific(result)
    assert report["sql_status"] == "skipped" and report["sql_source"] == "none"
    assert "documents_docs" in report["skipped_reason"]
    with pytest.raises(InvalidParametersError) as caught:
        sqlrag(loaded_service, query, {"combine_with_vector": False})
    assert caught.value.details["reason"] == "no_tables"
    # The documents view is still there to query.
    by_year = sqlrag(
        loaded_service, query, {"sql": "SELECT id FROM documents_docs WHERE year >= 2020 ORDER BY id"}
    )
    assert specific(by_year)["rows"] == [["sourdough"], ["volcano"]]


def _validate_output(tool: str, result: dict[str, Any]) -> None:
    spec = tool_spec(tool)
    assert spec is not None
    Draft202012Validator(spec["outputSchema"]).validate(result)


def test_ingest_table_and_table_schema_tools(sql_service: RagService, tmp_path: Path) -> None:
    methods = sql_service.methods()
    rates = {"table": "Rates", "csv": "region;rate;since\nnorth;0.25;2024-01-01\n"}
    # t_rates is shared: naming a collection would move it out of every other collection's reach.
    with pytest.raises(InvalidParametersError, match="'rates' is shared by every collection"):
        methods["ingest_table"]({**rates, "collection_id": "docs"})
    result = methods["ingest_table"](rates)
    _validate_output("rag_ingest_table", result)
    assert result["replaced"] is True and result["sql_name"] == "t_rates" and result["collection_id"] is None
    assert [c["type"] for c in result["columns"]] == ["TEXT", "REAL", "DATE"]
    with pytest.raises(InvalidParametersError, match="either rows"):
        methods["ingest_table"]({"table": "x", "rows": [{"a": 1}], "csv": "a\n1\n"})
    with pytest.raises(InvalidParametersError, match="table"):
        methods["ingest_table"]({"table": "1bad", "rows": [{"a": 1}]})
    # As rag_ingest, a table ingested into a new collection creates it (the documented example starts so).
    made = methods["ingest_table"]({"table": "x", "rows": [{"a": 1}], "collection_id": "shop"})
    assert made["collection_id"] == "shop" and "shop" in {c.id for c in sql_service.store.list_collections()}
    arguments = {"query": "a?", "collection_id": "shop", "technique_params": {"sql": "SELECT a FROM t_x"}}
    assert specific(sql_service.execute({"technique": "sqlrag", "arguments": arguments}))["rows"] == [[1]]
    pipeline = sql_service.pipelines["sqlrag"]
    assert isinstance(pipeline, SqlRagPipeline)
    (tmp_path / "y.csv").write_text("a\n1\n", encoding="utf-8")
    with pytest.raises(InvalidParametersError, match="collection id"):  # the CLI's path: no schema before it
        pipeline.ingest_table_file(tmp_path / "y.csv", "y", "bad id!")

    schema = methods["table_schema"]({"collection_id": "docs", "sample_values": 2})
    _validate_output("rag_table_schema", schema)
    assert [t["name"] for t in schema["tables"]] == ["t_rates", "t_sales", "documents_docs"]
    sales = next(t for t in schema["tables"] if t["name"] == "t_sales")
    assert sales["row_count"] == 4 and sales["collection_id"] == "docs"
    assert all(len(c["samples"]) <= 2 for c in sales["columns"])
    assert next(c for c in sales["columns"] if c["name"] == "region")["samples"] == ["north", "south"]
    bare = methods["table_schema"]({"tables": ["sales", "t_other"], "sample_values": 0})
    assert [t["name"] for t in bare["tables"]] == ["t_other", "t_sales"]
    assert all(c["samples"] == [] for t in bare["tables"] for c in t["columns"])
    everything = methods["table_schema"]({})
    assert {t["name"] for t in everything["tables"]} >= {"documents_docs", "documents_notes", "t_other"}
    with pytest.raises(InvalidParametersError, match="no such tables"):
        methods["table_schema"]({"collection_id": "docs", "tables": ["other"]})
    assert sql_service.tool_for("table_schema", {}) == ("rag_table_schema", None)


def test_cli_ingest_table(
    sql_service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "orders.jsonl"
    path.write_text('{"id": 1, "total": 9.5, "when": "2024-06-01T10:00:00"}\n{"id": 2, "total": 3}\n')
    args = build_parser().parse_args(["ingest-table", str(path), "--table", "orders", "--collection", "docs"])
    assert cmd_ingest_table(args, sql_service) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sql_name"] == "t_orders" and summary["row_count"] == 2
    assert {c["name"]: c["type"] for c in summary["columns"]} == {
        "id": "INTEGER",
        "total": "REAL",
        "when_": "DATETIME",  # a reserved word gets a trailing '_'
    }
    result = sqlrag(sql_service, params={"sql": "SELECT sum(total) FROM t_orders"})
    assert specific(result)["rows"] == [[12.5]]


def test_a_refused_table_leaves_no_new_collection_behind(
    any_service: RagService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused rag_ingest_table (or `iris-rag ingest-table`) that names a new collection leaves none.

    The collection was created before the table was checked: each refusal below left it, empty, listed.
    """
    dispatcher = Dispatcher(any_service)
    pipeline = pipeline_of(any_service)
    pipeline.ingest_table({"table": "pay", "collection_id": "secret", "rows": [{"who": "bob"}]})
    pipeline.ingest_table({"table": "shared", "rows": [{"who": "everyone"}]})

    def collections() -> list[str]:
        return [c.id for c in any_service.store.list_collections()]

    before = collections()
    assert before == ["secret"]
    grantee = Principal("bob", frozenset({"read", "write"}), frozenset({"granted"}))
    reader = Principal("reader", frozenset({"read"}), None)
    rows = [{"who": "eve"}]
    refusals: list[tuple[dict[str, Any], Principal | None, str]] = [
        ({"table": "pay", "collection_id": "new1", "rows": rows}, None, "INVALID_PARAMETERS"),
        ({"table": "shared", "collection_id": "new2", "rows": rows}, None, "INVALID_PARAMETERS"),
        ({"table": "pay", "collection_id": "granted", "rows": rows}, grantee, "FORBIDDEN"),
        ({"table": "mine", "collection_id": "new3", "rows": rows}, reader, "FORBIDDEN"),
        ({"table": "header", "collection_id": "new4", "csv": "a,b\n"}, None, "INVALID_PARAMETERS"),
        ({"table": "bad", "collection_id": "new5", "csv": "a,b\n1,2,3\n"}, None, "INVALID_PARAMETERS"),
        ({"table": "blank", "collection_id": "new6", "rows": [{}]}, None, "INVALID_PARAMETERS"),
        (
            {"table": "wide", "collection_id": "new7", "rows": [{f"c{i}": i for i in range(201)}]},
            None,
            "INVALID_PARAMETERS",
        ),
    ]
    for arguments, principal, code in refusals:
        ok, answer = dispatcher.call("ingest_table", arguments, principal)
        assert not ok and answer["code"] == code, (arguments, answer)
        assert collections() == before, arguments

    # The CLI's path: a file that cannot be read or holds no rows, a bad table name.
    (tmp_path / "header.csv").write_text("a,b\n", encoding="utf-8")
    (tmp_path / "empty.csv").write_text("", encoding="utf-8")
    (tmp_path / "good.csv").write_text("a\n1\n", encoding="utf-8")
    for name, table in (("header.csv", "t"), ("empty.csv", "t"), ("missing.csv", "t"), ("good.csv", "1bad")):
        with pytest.raises(InvalidParametersError):
            pipeline.ingest_table_file(tmp_path / name, table, "new8")
        assert collections() == before, name

    # A store that fails while writing the table rolls the new collection back with it.
    monkeypatch.setattr(pipeline._storage, "replace_table", lambda *_: raise_unwritable_store())
    ok, answer = dispatcher.call("ingest_table", {"table": "t", "collection_id": "new9", "rows": rows})
    assert not ok and collections() == before, answer


def test_extract_sql_from_llm_replies() -> None:
    assert extract_sql("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract_sql("Here it is:\n```\nSELECT 2\n```\nDone.") == "SELECT 2"
    assert extract_sql("SQL: SELECT 3;") == "SELECT 3"


@pytest.fixture
def postgres_llm_service(
    postgres_url: str, tmp_path: Path, embedder: Embedder, fake_llm: FakeOpenAIServer
) -> Iterator[RagService]:
    """llm_service's tables and documents on RAG_STORE=postgres (a fresh database)."""
    settings = Settings(
        RAG_STORE="postgres",
        RAG_POSTGRES_URL=postgres_url,
        RAG_DATA_DIR=tmp_path / "postgres",
        RAG_TECHNIQUES="sqlrag",
        **fake_llm.llm_settings(),
    )
    service = RagService(settings, embedder=embedder)
    try:
        load_tables(service)
        fake_llm.requests.clear()
        yield service
    finally:
        service.close()


def test_postgres_answers_from_a_table_and_a_documents_view(
    postgres_llm_service: RagService, fake_llm: FakeOpenAIServer
) -> None:
    """End to end on Postgres: the LLM writes PostgreSQL, rows answer, a delete leaves the view."""
    result = sqlrag(postgres_llm_service, "Total sales per region?")
    report = specific(result)
    assert report["sql_source"] == "llm" and sorted(report["rows"]) == [
        ["east", 1.0],
        ["north", 13.5],
        ["south", 7.0],
    ]
    assert "PostgreSQL SELECT" in fake_llm.requests[0]["body"]["messages"][0]["content"]
    assert result["metadata"]["answer_source"] == "llm" and ids(result)[0] == SQL_DOCUMENT_ID
    assert "| north | 13.5 |" in fake_llm.requests[-1]["body"]["messages"][1]["content"]

    fake_llm.reply = "SELECT id, title FROM documents_docs WHERE year >= 2020 ORDER BY year DESC"
    recent = specific(sqlrag(postgres_llm_service, "Which documents are from 2020 or later?", generate=False))
    assert recent["rows"] == [["volcano", "Volcanic eruptions"], ["sourdough", "Baking sourdough"]]
    assert postgres_llm_service.store.delete_document("docs", "volcano")
    after = specific(sqlrag(postgres_llm_service, "Which documents are from 2020 or later?", generate=False))
    assert after["rows"] == [["sourdough", "Baking sourdough"]], "the deleted document left the view"

    fake_llm.reply = "SELECT pg_sleep(5)"
    with pytest.raises(SqlRejectedError) as caught:
        sqlrag(postgres_llm_service, "Wait a while", generate=False)
    assert caught.value.details["rules"]["dialect"] == "postgres"
    assert [a["sql"] for a in caught.value.details["attempts"]] == ["SELECT pg_sleep(5)"] * 2
