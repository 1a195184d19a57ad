"""SQLRAG: answer from structured tables with one guarded, read-only SELECT, next to dense retrieval.

The SQL comes from the caller (technique_params.sql: the natural path for an MCP client, itself an LLM)
or from the configured LLM, which writes it from the question and the tables' schema. Whatever wrote it,
iris_rag.techniques.sqlrag.safety checks it and runs it read-only; the rows become passage [1] of the answer,
next to the collection's dense-retrieval passages, and come back in metadata with the SQL that ran.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from iris_rag import access
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import (
    GenerationFailedError,
    InvalidParametersError,
    SqlRejectedError,
)
from iris_rag.generation import (
    EXTRACTIVE_STEPS_NOTE,
    NOTHING_RETRIEVED,
    ExtractiveGenerator,
    Generation,
    Passage,
    Reasoning,
    ReasoningStep,
)
from iris_rag.llm import TechniqueLLM, failure_text
from iris_rag.pipeline import Pipeline, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.settings import Settings
from iris_rag.stores.base import CollectionInfo, StoredChunk, check_collection_id
from iris_rag.stores.filters import parse_filters
from iris_rag.stores.technique_index import TechniqueIndex
from iris_rag.techniques.sqlrag.safety import (
    COMPLEXITY,
    MAX_RESULT_BYTES,
    MAX_SQL_CHARS,
    Complexity,
    SqlGate,
    check_sql,
    dialect_name,
    select_limits,
)
from iris_rag.techniques.sqlrag.schema import describe_tables, query_rules, schema_text
from iris_rag.techniques.sqlrag.storage import CheckedSql, SqlResult, TableInfo
from iris_rag.techniques.sqlrag.tables import (
    TABLE_PREFIX,
    DocumentViews,
    RawTable,
    ensure_view,
    ingest_table,
    parse_csv,
    parse_records,
    read_table_file,
)
from iris_rag.validation import validate_arguments

SQL_DOCUMENT_ID = "sql-result"
SQL_CHUNK_ID = f"{SQL_DOCUMENT_ID}#0"
# The LLM gets a second try, told why its first statement was refused.
GENERATION_ATTEMPTS = 2
SQL_MAX_TOKENS = 512
ANSWER_ROWS = 20
PASSAGE_CELL_CHARS = 200
# Characters of the table passage that are not rows: its summary line, title and <passage> markup.
TABLE_PASSAGE_MARGIN = 600

SqlSource = Literal["caller", "llm"]


# At least one character that is not whitespace (what the JSON Schema says, in its own regex syntax).
NOT_BLANK = r"[^\s\x1c-\x1f\x85\ufeff]"
TABLE_NAME = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"


class SqlParams(BaseModel):
    """technique_params of rag_sqlrag (schema: schemas/tools/rag_sqlrag.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sql: (
        Annotated[str, StringConstraints(min_length=1, max_length=MAX_SQL_CHARS, pattern=NOT_BLANK)] | None
    ) = None
    enable_sql_generation: bool = True
    combine_with_vector: bool = True
    allowed_tables: (
        Annotated[
            tuple[Annotated[str, StringConstraints(pattern=TABLE_NAME)], ...],
            Field(min_length=1, max_length=50),
        ]
        | None
    ) = Field(None, json_schema_extra={"uniqueItems": True})
    max_sql_complexity: Complexity = "moderate"
    max_rows: int = Field(100, ge=1, le=1000)
    timeout_ms: int = Field(2000, ge=50, le=10_000)

    @field_validator("allowed_tables")
    @classmethod
    def _distinct_tables(cls, tables: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if tables is not None and len(set(tables)) != len(tables):
            msg = "allowed_tables names a table twice"
            raise ValueError(msg)
        return tables

    @model_validator(mode="after")
    def _sql_is_not_blank(self) -> SqlParams:
        if self.sql is not None and not self.sql.strip():
            msg = "sql is blank; pass one SELECT statement or leave sql out"
            raise ValueError(msg)
        return self


@dataclass(slots=True)
class SqlRun:
    """A statement that ran: where it came from, as checked, and what it returned."""

    source: SqlSource
    checked: CheckedSql
    result: SqlResult
    attempts: list[dict[str, Any]] = field(default_factory=list)


def extract_sql(reply: str) -> str:
    """The statement in an LLM reply: the first ```sql block if any, without a leading 'SQL:' or ';'."""
    fenced = re.search(r"```(?:sql|sqlite)?\s*\n?(.*?)```", reply, flags=re.DOTALL | re.IGNORECASE)
    text = (fenced.group(1) if fenced else reply).strip()
    text = re.sub(r"^sql\s*:\s*", "", text, flags=re.IGNORECASE)
    return text.rstrip().rstrip(";").strip()


class SqlWriter:
    """Asks the configured OpenAI-compatible LLM for one SELECT (a technique-internal call)."""

    def __init__(self, settings: Settings) -> None:
        self._llm = TechniqueLLM(settings)
        self.secrets = self._llm.secrets

    def write(
        self,
        question: str,
        schema: str,
        complexity: Complexity,
        rejected: list[dict[str, Any]],
        dialect: str = "sqlite",
    ) -> str:
        """One statement for the question; earlier rejected attempts are shown with their reasons."""
        system = (
            f"You translate a question into exactly one {dialect_name(dialect)} SELECT statement over the "
            "tables described. "
            "Use only those tables and columns, by their exact names. Read-only: no INSERT, UPDATE, DELETE, "
            "DDL, PRAGMA or ATTACH. Allowed complexity: "
            f"{COMPLEXITY[complexity].describe()}. Reply with the SQL statement only, no explanation."
        )
        user = f"Tables:\n{schema}\n\nQuestion: {question}"
        for attempt in rejected:
            user += (
                f"\n\nThis statement was rejected ({attempt['rejected']}):\n{attempt['sql']}\n"
                "Write a corrected one."
            )
        sql = extract_sql(self._llm.complete(system, user, max_tokens=SQL_MAX_TOKENS))
        if not sql:
            msg = "the LLM's reply holds no SQL statement"
            raise GenerationFailedError(msg)
        return sql


def _cell_text(value: Any, limit: int) -> str:
    text = "NULL" if value is None else str(value)
    text = text.replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_rows(
    columns: list[str], rows: list[list[Any]], cell_chars: int, budget: int | None = None
) -> tuple[str, int]:
    """Rows as a Markdown-style pipe table, and how many it holds: those that fit budget characters."""
    lines = [
        "| " + " | ".join(_cell_text(c, cell_chars) for c in columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    used = sum(len(line) + 1 for line in lines)
    for row in rows:
        line = "| " + " | ".join(_cell_text(v, cell_chars) for v in row) + " |"
        used += len(line) + 1
        if budget is not None and used > budget and len(lines) > 2:  # one row at least, however wide
            break
        lines.append(line)
    return "\n".join(lines), len(lines) - 2


def _rows_summary(run: SqlRun, rendered: int) -> str:
    count = len(run.result.rows)
    if run.result.truncated_by == "max_result_bytes":
        text = f"{count} rows (cut at the result size limit of {MAX_RESULT_BYTES:,} bytes; more rows matched)"
    elif run.result.truncated:
        text = f"{count} rows (cut at max_rows; more rows matched)"
    else:
        text = f"{count} row{'s' if count != 1 else ''}"
    if rendered < count:
        text += (
            f"; rows sent to the LLM: {rendered} of {count} (LLM_CONTEXT_CHARS; every row is in "
            "metadata.technique_specific.rows)"
        )
    return text


class SqlRagPipeline(Pipeline):
    """A guarded SELECT over structured tables; its rows are passage [1], dense passages follow."""

    technique = "sqlrag"
    params_model = SqlParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._views = DocumentViews(self.context.store)
        self._storage = self._views.storage
        settings = self.context.settings
        self._gate = SqlGate(settings.sql_max_concurrent)
        self._writer = SqlWriter(settings) if settings.llm_provider == "openai" else None

    def technique_index(self) -> TechniqueIndex:
        """The documents views, refreshed inside every ingest (and the registry of structured tables)."""
        return self._views

    def extra_methods(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """rag_ingest_table and rag_table_schema."""
        return {"ingest_table": self.ingest_table, "table_schema": self.table_schema}

    # Retrieval
    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: SqlParams
    ) -> Retrieval:
        """Run the SQL leg (caller's or LLM's statement) and the dense leg; the rows are passage [1]."""
        store = self.context.store
        scope = self._scope(collection.id, params.allowed_tables)
        run: SqlRun | None = None
        skipped: str | None = None
        if params.sql is not None:
            run = self._caller_sql(params.sql, scope, params)
        elif params.allowed_tables is not None or any(t.kind == "table" for t in scope):
            run = self._generated_sql(query, scope, params)
        else:
            skipped = (
                "no structured tables belong to this collection (only its documents view "
                f"{scope[0].name if scope else ''}), so no SQL was written; "
                "pass technique_params.sql to query it"
            )
            if not params.combine_with_vector:
                msg = (
                    "nothing to answer from: no structured tables for this collection, no sql given and "
                    "combine_with_vector is false; pass technique_params.sql or ingest a table"
                )
                raise InvalidParametersError(msg, self._schema_details(scope, "no_tables"))

        documents = [self._table_passage(run)] if run else []
        vector_k = options.top_k - len(documents)
        dense = 0
        if params.combine_with_vector and vector_k > 0:
            query_vector = self.context.embedder.encode_query(query)
            hits = store.vector_search(collection.id, query_vector, vector_k, parse_filters(options.filters))
            scores = {hit.chunk_id: hit.score for hit in hits}
            chunks = store.get_chunks(collection.id, list(scores))
            documents += [RetrievedDocument(c, scores[c.chunk_id]) for c in chunks]
            dense = len(hits)

        specific: dict[str, Any] = {
            "sql_source": run.source if run else "none",
            "sql_status": "executed" if run else "skipped",
            "tables_in_scope": [t.name for t in scope],
            "max_sql_complexity": params.max_sql_complexity,
            "combine_with_vector": params.combine_with_vector,
            "vector_candidates": dense,
            "table_passage": run is not None,
        }
        if skipped:
            specific["skipped_reason"] = skipped
        if run:
            specific.update(self._run_report(run, params))
        return Retrieval(
            documents=documents,
            documents_searched=store.chunk_count(collection.id) if params.combine_with_vector else 0,
            technique_specific=specific,
        )

    def _run_report(self, run: SqlRun, params: SqlParams) -> dict[str, Any]:
        checked, result = run.checked, run.result
        report: dict[str, Any] = {
            "sql": checked.sql,
            "executed_sql": checked.executed_sql,
            "tables_used": list(checked.tables),
            "complexity": checked.complexity,
            "columns": result.columns,
            "rows": result.rows,
            "row_count": len(result.rows),
            "truncated": result.truncated,
            "truncated_by": result.truncated_by,
            "max_rows": params.max_rows,
            "max_result_bytes": MAX_RESULT_BYTES,
            "query_limit": checked.query_limit,
            "row_limit": checked.row_limit,
            "timeout_ms": params.timeout_ms,
            "execution_ms": result.execution_ms,
        }
        if run.source == "llm":
            report["llm_attempts"] = run.attempts
        return report

    def _scope(self, collection_id: str, allowed_tables: tuple[str, ...] | None) -> list[TableInfo]:
        """The tables a statement may read: the collection's own and shared ones, narrowed by allowed_tables.

        allowed_tables only narrows: a table of another collection is refused like one that does not
        exist, so no call reads another collection's rows.
        """
        ensure_view(self._storage, collection_id)
        tables = [t for t in self._storage.list_tables() if t.collection_id in (None, collection_id)]
        if allowed_tables is None:
            return tables
        by_name = {t.name: t for t in tables}
        chosen: dict[str, TableInfo] = {}
        unknown = []
        for name in allowed_tables:
            key = name.lower()
            info = by_name.get(key) or by_name.get(TABLE_PREFIX + key)
            if info is None:
                unknown.append(name)
            else:
                chosen[info.name] = info
        if unknown:
            msg = (
                f"allowed_tables names tables that collection {collection_id!r} cannot read (not its own, "
                f"not shared, or not registered): {', '.join(unknown)}"
            )
            raise InvalidParametersError(msg, {"unknown": unknown, "queryable": sorted(by_name)})
        return list(chosen.values())

    def _execute(self, sql: str, scope: list[TableInfo], params: SqlParams) -> tuple[CheckedSql, SqlResult]:
        """Check the statement against the scope and run it read-only."""
        check_cancelled()
        storage = self._storage
        # A table of a collection the caller may not see is refused as one that does not exist.
        tables = storage.list_tables()
        hidden = {
            t.name.lower()
            for t in tables
            if t.collection_id is not None and not access.can_see(t.collection_id)
        }
        existing = [name for name in storage.object_names() if name.lower() not in hidden]
        registered = [t.name for t in tables if t.name.lower() not in hidden]
        checked = check_sql(
            sql,
            dialect=storage.dialect,
            allowed=[t.name for t in scope],
            registered=registered,
            existing=existing,
            complexity=params.max_sql_complexity,
            max_rows=params.max_rows,
        )
        limits = select_limits(
            [t.name for t in scope],
            [t.name for t in scope if t.kind == "documents_view"],
            allow_recursive=COMPLEXITY[params.max_sql_complexity].recursive,
            timeout_ms=params.timeout_ms,
        )
        result = storage.run_select(checked, limits, self._gate)
        return checked, result

    def _caller_sql(self, sql: str, scope: list[TableInfo], params: SqlParams) -> SqlRun:
        try:
            checked, result = self._execute(sql, scope, params)
        except SqlRejectedError as exc:
            exc.details |= {"sql": sql, **self._schema_details(scope)}
            raise
        return SqlRun("caller", checked, result)

    def _generated_sql(self, query: str, scope: list[TableInfo], params: SqlParams) -> SqlRun:
        """Let the LLM write the statement (two tries); without one, fail with the schema to write it from."""
        if self._writer is None or not params.enable_sql_generation:
            reason = "no_llm" if self._writer is None else "generation_disabled"
            why = (
                "no LLM is configured on this server to write it (LLM_PROVIDER=none)"
                if self._writer is None
                else "enable_sql_generation is false"
            )
            msg = (
                f"technique_params.sql is required: {why}. Write one {dialect_name(self._storage.dialect)} "
                "SELECT over the tables in "
                "error.details.schema and call again with it"
            )
            raise InvalidParametersError(msg, self._schema_details(scope, reason))
        described = describe_tables(self._storage, scope)
        schema = schema_text(described)
        rejected: list[dict[str, Any]] = []
        last: SqlRejectedError | None = None
        for _ in range(GENERATION_ATTEMPTS):
            check_cancelled()
            try:
                sql = self._writer.write(
                    query, schema, params.max_sql_complexity, rejected, self._storage.dialect
                )
            except Exception as exc:
                why = failure_text(exc, self._writer.secrets)
                msg = (
                    f"technique_params.sql is required: the LLM failed to write it ({why}). "
                    f"Write one {dialect_name(self._storage.dialect)} SELECT over the tables in "
                    "error.details.schema"
                )
                raise InvalidParametersError(msg, self._schema_details(scope, "llm_failed")) from exc
            try:
                checked, result = self._execute(sql, scope, params)
            except SqlRejectedError as exc:
                rejected.append({"sql": sql, "rejected": exc.details.get("reason", exc.message)})
                last = exc
                continue
            return SqlRun("llm", checked, result, [*rejected, {"sql": sql, "rejected": None}])
        assert last is not None
        last.details |= {
            "attempts": rejected,
            "schema": described,
            "rules": query_rules(self._storage.dialect),
        }
        raise last

    def _schema_details(self, scope: list[TableInfo], reason: str | None = None) -> dict[str, Any]:
        details: dict[str, Any] = {
            "schema": describe_tables(self._storage, scope),
            "rules": query_rules(self._storage.dialect),
        }
        return {"reason": reason, **details} if reason else details

    def _table_passage(self, run: SqlRun) -> RetrievedDocument:
        """The rows as one passage (ranked first: they are exact, not similar)."""
        result = run.result
        tables = list(run.checked.tables)
        sql = f"SQL: {run.checked.executed_sql}\n"
        # The rows fill LLM_CONTEXT_CHARS, less the SQL and the lines around them; the rest are counted.
        room = self.context.settings.llm_context_chars - len(sql) - TABLE_PASSAGE_MARGIN
        table, rendered = render_rows(result.columns, result.rows, PASSAGE_CELL_CHARS, room)
        content = f"{sql}Result: {_rows_summary(run, rendered)}\n\n{table}"
        chunk = StoredChunk(
            chunk_id=SQL_CHUNK_ID,
            document_id=SQL_DOCUMENT_ID,
            index=0,
            content=content,
            start_char=0,
            end_char=len(content),
            title=f"Table rows: {', '.join(tables) or 'SQL result'}",
            metadata={
                "source": "sql",
                "kind": "sql_rows",
                "sql": run.checked.executed_sql,
                "tables": tables,
                "row_count": len(result.rows),
                "truncated": result.truncated,
                "truncated_by": result.truncated_by,
            },
        )
        return RetrievedDocument(chunk, 1.0, {"kind": "sql_rows", "sql_source": run.source})

    # Answer
    def generate(
        self,
        query: str,
        documents: list[RetrievedDocument],
        options: QueryOptions,
        similarity: dict[str, float] | None = None,
        empty_reason: str = NOTHING_RETRIEVED,
    ) -> Generation:
        """An LLM gets the rows as passage [1]; the extractive answer quotes them, then the passages."""
        table = next((d for d in documents if d.chunk.chunk_id == SQL_CHUNK_ID), None)
        if table is None or not isinstance(self.context.generator, ExtractiveGenerator):
            return super().generate(query, documents, options, similarity, empty_reason)
        similarity = similarity or {}
        citations = {SQL_DOCUMENT_ID: 1}
        passages = [
            Passage(
                citation=citations.setdefault(d.chunk.document_id, len(citations) + 1),
                document_id=d.chunk.document_id,
                title=d.chunk.title,
                content=d.chunk.content,
                score=d.score,
                query_similarity=similarity.get(d.chunk.chunk_id),
                chunk_id=d.chunk.chunk_id,
            )
            for d in documents
            if d is not table
        ]
        answer = self._rows_answer(table)
        # options.cot_steps: the rows come first, quoted as the SQL returned them, then the passages' chain.
        chain = [ReasoningStep("The SQL result's rows are quoted first, as returned.", (SQL_CHUNK_ID,))]
        if passages:
            extractive = self.context.generator.generate(
                query,
                passages,
                temperature=options.temperature,
                max_tokens=options.max_tokens,
                steps=options.cot_steps,
            )
            answer += "\n\n" + extractive.answer
            chain += extractive.steps.steps if extractive.steps else ()
        steps = Reasoning("extractive", EXTRACTIVE_STEPS_NOTE, tuple(chain)) if options.cot_steps else None
        return Generation(answer, self.context.generator.model_name, "extractive", steps)

    def _rows_answer(self, table: RetrievedDocument) -> str:
        metadata = table.chunk.metadata
        lines = table.chunk.content.split("\n")
        start = next(i for i, line in enumerate(lines) if line.startswith("| "))
        header, separator, *rows = lines[start:]
        sql = metadata["sql"]
        if not metadata["row_count"]:
            return f"The SQL returned no rows [1].\nSQL: {sql}"
        shown = rows[:ANSWER_ROWS]
        text = (
            "From the table rows [1] (the SQL result, quoted as returned; no LLM configured):\n"
            + "\n".join([header, separator, *shown])
        )
        if metadata["row_count"] > len(shown) or metadata["truncated"]:
            more = {
                "max_rows": " and more rows matched (raise max_rows)",
                "max_result_bytes": " and more rows matched past the result size limit (select fewer or "
                "shorter columns)",
            }.get(metadata["truncated_by"], "")
            text += (
                f"\n(showing {len(shown)} of {metadata['row_count']} rows{more}; all returned rows are in "
                "metadata)"
            )
        return text + f"\nSQL: {sql}"

    # Bridge methods
    def _require_collection(self, collection_id: str) -> None:
        if not access.can_see(collection_id) or self.context.store.get_collection(collection_id) is None:
            known = [c.id for c in self.context.store.list_collections()]
            raise access.collection_not_found(collection_id, known)

    def _ingest(self, table: str, raw: RawTable, collection_id: str | None, source: str) -> dict[str, Any]:
        access.require_writable(collection_id)
        create_collection = None
        if collection_id is not None and self.context.store.get_collection(collection_id) is None:
            # As rag_ingest: a collection is made on first use (a key may write to it, checked above), in
            # the table's own transaction: a refused table leaves none.
            check_collection_id(collection_id)
            create_collection = partial(
                self.context.store.create_collection,
                collection_id,
                self.context.settings.embedding_model_id,
                self.context.embedder.dimension,
            )
        started = time.perf_counter()
        result = ingest_table(
            self._storage,
            table,
            raw,
            collection_id=collection_id,
            source=source,
            create_collection=create_collection,
        )
        return {**result, "time_ms": round((time.perf_counter() - started) * 1000, 3)}

    def ingest_table_file(self, path: Path, table: str, collection_id: str | None) -> dict[str, Any]:
        """Load a CSV or JSON-lines file as table t_<table>, replacing it if it exists (the CLI's path)."""
        return self._ingest(table, read_table_file(path), collection_id, path.name)

    def ingest_table(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_ingest_table: rows (JSON objects) or CSV text become table t_<table>."""
        arguments = validate_arguments("rag_ingest_table", params)
        if ("rows" in arguments) == ("csv" in arguments):
            msg = "give the table's content as either rows (JSON objects) or csv (text), not both or neither"
            raise InvalidParametersError(msg)
        if "rows" in arguments:
            raw, source = parse_records(arguments["rows"]), "rag_ingest_table rows"
        else:
            raw, source = parse_csv(arguments["csv"]), "rag_ingest_table csv"
        return self._ingest(arguments["table"], raw, arguments.get("collection_id"), source)

    def table_schema(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_table_schema: the tables a statement may read, with columns, types and sample values."""
        arguments = validate_arguments("rag_table_schema", params)
        collection_id: str | None = arguments.get("collection_id")
        if collection_id is not None:
            self._require_collection(collection_id)
            tables = self._scope(collection_id, None)
        else:
            for collection in self.context.store.list_collections():
                ensure_view(self._storage, collection.id)
            tables = [
                t
                for t in self._storage.list_tables()
                if t.collection_id is None or access.can_see(t.collection_id)
            ]
        wanted = arguments.get("tables")
        if wanted:
            by_name = {t.name: t for t in tables}
            missing = [
                n for n in wanted if n.lower() not in by_name and TABLE_PREFIX + n.lower() not in by_name
            ]
            if missing:
                msg = f"no such tables here: {', '.join(missing)}"
                raise InvalidParametersError(msg, {"unknown": missing, "available": sorted(by_name)})
            keys = {by_name.get(n.lower(), by_name.get(TABLE_PREFIX + n.lower())) for n in wanted}
            tables = [t for t in tables if t in keys]
        return {
            "collection_id": collection_id,
            "tables": describe_tables(self._storage, tables, arguments.get("sample_values", 3)),
            "rules": query_rules(self._storage.dialect),
        }
