"""The SQL guard: one SELECT over registered structured tables, checked before it runs, contained as it runs.

Two independent layers, so that a gap in one is caught by the other:

1. check_sql() parses the statement with sqlglot (in the store's dialect, StructuredTableStorage.dialect)
   and refuses anything but exactly one SELECT (or UNION/INTERSECT/EXCEPT of SELECTs) that reads only
   allowed tables, within the complexity limits; it sets the row LIMIT and regenerates the SQL from the
   checked tree, so what runs is what was checked.
2. The store runs it (StructuredTableStorage.run_select) read-only within select_limits(): only the
   allowed tables, only SAFE_FUNCTIONS, bounded values and patterns, a time limit; on SQLite that is a
   read-only connection with an authorizer, lowered limits, a progress handler and a watchdog thread.
   A gate (SqlGate) caps how many statements run at once, so runaways cannot take every core from other
   calls.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, ParamSpec

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from iris_rag.cancellation import check_cancelled
from iris_rag.errors import SqlRejectedError
from iris_rag.techniques.sqlrag.storage import CheckedSql, SelectLimits

Complexity = Literal["simple", "moderate", "complex"]
_P = ParamSpec("_P")

MAX_SQL_CHARS = 10_000
MAX_PATTERN_CHARS = 1_000
MAX_VALUE_BYTES = 1_000_000
# All the rows of one result, as the JSON they become in the answer (collect_rows stops fetching past it).
MAX_RESULT_BYTES = 10 * MAX_VALUE_BYTES
# How often a call waiting for a free slot looks at its cancel token.
_WATCH_INTERVAL_S = 0.05
# Statements that may run at once per process (SqlGate's default).
DEFAULT_CONCURRENT_STATEMENTS = 2
# How a dialect is named in messages and prompts.
_DIALECT_NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def dialect_name(dialect: str) -> str:
    """The dialect as people name it (SQLite, PostgreSQL)."""
    return _DIALECT_NAMES.get(dialect, dialect)


# A printf/format field: %[flags][width][.precision]type, or "%%".
_FORMAT_FIELD = re.compile(r"%%|%[-+ #0,!]*(\*|\d+)?(?:\.(\*|\d+))?")


@dataclass(frozen=True, slots=True)
class ComplexityLimits:
    """What one max_sql_complexity level allows."""

    joins: int
    subqueries: int
    ctes: int
    set_operations: int
    window_functions: bool
    recursive: bool

    def describe(self) -> str:
        """One line for prompts, errors and the schema tool."""
        if self.joins == 0 and self.subqueries == 0:
            return "one table: no joins, subqueries, CTEs, UNION/INTERSECT/EXCEPT or window functions"
        return (
            f"at most {self.joins} joins, {self.subqueries} subqueries, "
            f"{self.ctes} {'' if self.recursive else 'non-recursive '}CTEs and "
            f"{self.set_operations} UNION/INTERSECT/EXCEPT; window functions allowed"
            + (
                "; recursive CTEs allowed (bounded by the row limit and the time limit)"
                if self.recursive
                else ""
            )
        )


COMPLEXITY: dict[Complexity, ComplexityLimits] = {
    "simple": ComplexityLimits(0, 0, 0, 0, window_functions=False, recursive=False),
    "moderate": ComplexityLimits(3, 2, 2, 2, window_functions=True, recursive=False),
    "complex": ComplexityLimits(8, 10, 8, 8, window_functions=True, recursive=True),
}

# Functions a query may call, as SQLite names them to the authorizer: pure computations on values.
SAFE_FUNCTIONS = frozenset(
    """abs avg count sum total min max group_concat string_agg lower upper length octet_length substr
    substring trim ltrim rtrim replace instr round coalesce ifnull nullif iif typeof date time datetime
    julianday strftime unixepoch timediff printf format concat concat_ws char hex unhex unicode quote like
    glob likely unlikely likelihood random sign ceil ceiling floor trunc ln log log10 log2 exp pow power
    sqrt pi mod acos asin atan atan2 cos sin tan degrees radians json json_extract json_array_length
    json_type json_valid json_quote json_array json_object json_group_array json_group_object -> ->>
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value
    nth_value""".split()
)
# Refused by name before anything runs: they touch files, load code or exist to build huge values.
DANGEROUS_FUNCTIONS = frozenset(
    """load_extension readfile writefile edit fts3_tokenizer fts5 randomblob zeroblob sqlite_compileoption_get
    sqlite_compileoption_used sqlite_offset sqlite_source_id sqlite_version changes total_changes
    last_insert_rowid sqlar_compress sqlar_uncompress shell_add_schema shell_escape_crnl
    shell_idquote shell_int32 shell_module_schema shell_putsnl zipfile""".split()
)
# Refused by name: they tell about the server (version, user, database, settings), not the data.
SYSTEM_INFORMATION = frozenset(
    """current_version version current_user session_user current_role user current_database
    current_schema current_schemas current_catalog current_setting set_config inet_server_addr
    inet_server_port inet_client_addr pg_backend_pid pg_postmaster_start_time""".split()
)
# PostgreSQL functions that build a value or a series as large as an argument says: SQLite's value limit
# (MAX_VALUE_BYTES) has no Postgres setting, so their sizes must be literal and bounded, or they are refused.
POSTGRES_SIZED_BUILDERS = frozenset({"repeat", "lpad", "rpad"})
POSTGRES_SERIES_BUILDERS = frozenset({"generate_series", "generate_subscripts", "array_fill"})
# Statement kinds that change something or reach outside the query; refused wherever they appear.
_FORBIDDEN: tuple[type[exp.Expr], ...] = (
    exp.DML,
    exp.DDL,
    exp.Drop,
    exp.Alter,
    exp.Attach,
    exp.Detach,
    exp.Pragma,
    exp.Command,
    exp.Transaction,
    exp.Commit,
    exp.Rollback,
    exp.Use,
    exp.Set,
    exp.Analyze,
    exp.Copy,
    exp.Describe,
)
_NESTED_QUERY_PARENTS = (exp.Subquery, exp.CTE, exp.SetOperation)


def reject(reason: str, stage: Literal["parse", "check", "execution"] = "check") -> NoReturn:
    """Raise SQL_REJECTED for one reason; details say which stage refused the statement."""
    msg = f"SQL rejected: {reason}"
    raise SqlRejectedError(msg, {"reason": reason, "stage": stage})


def _statement_kind(statement: exp.Expr) -> str:
    if isinstance(statement, exp.Command):
        return str(statement.this).upper()
    return statement.key.upper()


def _first_word(sql: str) -> str:
    words = sql.split(None, 1)
    return words[0].upper() if words else ""


def _literal_int(node: exp.Expr | None) -> int | None:
    """The value of an integer literal (possibly negated), else None."""
    if isinstance(node, exp.Neg):
        inner = _literal_int(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return int(node.this)
        except ValueError:
            return None
    return None


def _function_name(node: exp.Func) -> str:
    return node.name.lower() if isinstance(node, exp.Anonymous) else node.sql_name().lower()


def _written_name(node: exp.Func, dialect: str) -> str:
    """The function as the statement names it, for messages.

    sqlglot reads sqlite_version() and version() as one CURRENT_VERSION, a name the caller never wrote;
    the statement's dialect writes it back as it was spelt.
    """
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return node.sql(dialect=dialect).partition("(")[0].strip().lower() or _function_name(node)


def _refuse_deep_nesting(check: Callable[_P, CheckedSql]) -> Callable[_P, CheckedSql]:
    """SQL_REJECTED for a statement nested past what the parser's recursion can take."""

    @functools.wraps(check)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> CheckedSql:
        try:
            return check(*args, **kwargs)
        except RecursionError:  # the parser and the tree walks recurse once per level of nesting
            reject("it is nested too deeply (expressions inside expressions, hundreds of levels)", "parse")

    return checked


@_refuse_deep_nesting
def check_sql(
    sql: str,
    *,
    dialect: str,
    allowed: Collection[str],
    registered: Collection[str],
    existing: Collection[str],
    complexity: Complexity,
    max_rows: int,
) -> CheckedSql:
    """Parse and check one statement; returns it with the row limit applied, or raises SQL_REJECTED.

    dialect: the sqlglot dialect of the store it runs on; allowed: the table and view names the statement
    may read; registered: every structured table (for messages); existing: every name in the database, so
    that a CTE cannot shadow one.
    """
    text = sql.strip()
    if not text:
        reject("the statement is empty", "parse")
    if len(text) > MAX_SQL_CHARS:
        reject(f"the statement has {len(text)} characters; at most {MAX_SQL_CHARS}", "parse")
    try:
        parsed = sqlglot.parse(text, read=dialect)
    except SqlglotError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reject(f"it does not parse as {dialect_name(dialect)}: {first_line}", "parse")
    statements = [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]
    if len(statements) != 1:
        reject(f"exactly one statement is allowed; found {len(statements)}", "parse")
    root = statements[0]
    if not isinstance(root, exp.Select | exp.SetOperation):
        kind = _statement_kind(root) if isinstance(root, _FORBIDDEN) else _first_word(text)
        reject(f"only SELECT is allowed; this is {kind}")

    allowed_names = {name.lower() for name in allowed}
    registered_names = {name.lower() for name in registered}
    existing_names = {name.lower() for name in existing}
    cte_names = {cte.alias_or_name.lower() for cte in root.find_all(exp.CTE)}
    for name in sorted(cte_names):
        if name in existing_names or name in registered_names or name.startswith(("sqlite_", "pg_")):
            reject(f"the CTE name {name!r} is the name of a table; rename the CTE")

    used: dict[str, None] = {}
    windows = subqueries = 0
    for node in root.walk():
        if isinstance(node, _FORBIDDEN):
            reject(f"{_statement_kind(node)} is not allowed inside a query")
        if isinstance(node, exp.Table):
            _check_table(node, dialect, cte_names, allowed_names, registered_names, existing_names, used)
        elif isinstance(node, exp.Func):
            _check_function(node, dialect)
        if dialect == "postgres":
            _check_postgres(node)
        if isinstance(node, exp.Column) and not node.table and node.name.lower() in SYSTEM_INFORMATION:
            # Postgres reads a bare `user` or `current_role` as the session's role, not a column.
            reject(f"{node.name} tells about the server, not the data; it is not available")
        if isinstance(node, exp.Placeholder | exp.Parameter):
            reject("bind parameters (?, :name, @name) are not supported; write the values as literals")
        if isinstance(node, exp.Like | exp.ILike | exp.Glob):
            pattern = node.expression
            if isinstance(pattern, exp.Literal) and len(str(pattern.this)) > MAX_PATTERN_CHARS:
                reject(
                    f"a LIKE/GLOB pattern of {len(str(pattern.this))} characters; at most {MAX_PATTERN_CHARS}"
                )
        if isinstance(node, exp.Select) and node.args.get("into"):
            reject("SELECT ... INTO writes a table and is not allowed")
        if isinstance(node, exp.Select) and node.args.get("locks"):
            reject("FOR UPDATE/FOR SHARE locks rows and is not allowed")
        if isinstance(node, exp.Window):
            windows += 1
        if isinstance(node, exp.Subquery) or (
            isinstance(node, exp.Select | exp.SetOperation)
            and node is not root
            and not isinstance(node.parent, _NESTED_QUERY_PARENTS)
        ):
            subqueries += 1

    counts: dict[str, Any] = {
        "joins": len(list(root.find_all(exp.Join))),
        "subqueries": subqueries,
        "ctes": len(cte_names),
        "set_operations": len(list(root.find_all(exp.SetOperation))),
        "window_functions": windows,
        "recursive": any(bool(w.args.get("recursive")) for w in root.find_all(exp.With)),
    }
    _check_complexity(counts, complexity)
    query_limit, row_limit, fetch_limit = _apply_limit(root, max_rows)
    return CheckedSql(
        sql=sql,
        executed_sql=root.sql(dialect=dialect),
        tables=tuple(used),
        ctes=tuple(sorted(cte_names)),
        complexity=counts,
        query_limit=query_limit,
        row_limit=row_limit,
        fetch_limit=fetch_limit,
    )


def _check_table(
    node: exp.Table,
    dialect: str,
    cte_names: set[str],
    allowed: set[str],
    registered: set[str],
    existing: set[str],
    used: dict[str, None],
) -> None:
    if not isinstance(node.this, exp.Identifier):
        inner = node.this
        function = inner.sql_name() if isinstance(inner, exp.Func) else inner.sql()
        function = inner.name if isinstance(inner, exp.Anonymous) else function.lower()
        reject(f"table-valued functions such as {function}() are not allowed; query a table")
    database = node.db.lower()
    # SQLite names the store's own file `main`; on Postgres every qualified name is another schema's.
    own = ("", "main") if dialect == "sqlite" else ("",)
    if node.catalog or database not in own:
        reject(f"{node.sql(dialect=dialect)}: only the store's own tables can be read")
    name = node.name.lower()
    if name in cte_names and not database:
        return
    if name in allowed:
        used[name] = None
    elif name in registered:
        reject(f"table {node.name!r} is not in allowed_tables ({', '.join(sorted(allowed))})")
    elif name in existing or name.startswith(("sqlite_", "pg_")):
        reject(f"table {node.name!r} is internal to the store, not structured data")
    else:
        reject(f"no table {node.name!r}; queryable: {', '.join(sorted(allowed)) or 'none'}")


def _check_function(node: exp.Func, dialect: str) -> None:
    name = _function_name(node)
    # Written back only for a refusal: every AND of a long chain is a Func, and writing each is quadratic.
    if name in DANGEROUS_FUNCTIONS:
        written = _written_name(node, dialect)
        reject(f"function {written}() is not allowed (it touches files, loads code or builds huge values)")
    if name in SYSTEM_INFORMATION:
        written = _written_name(node, dialect)
        reject(f"function {written}() tells about the server, not the data; it is not available")
    if isinstance(node, exp.RegexpLike):
        reject("REGEXP is not available; use LIKE, GLOB or instr()")
    if isinstance(node, exp.Anonymous) and name not in SAFE_FUNCTIONS:
        reject(f"function {name}() is not available; allowed: {', '.join(sorted(SAFE_FUNCTIONS))}")
    if name in ("printf", "format"):
        _check_format(node)


def _check_postgres(node: exp.Expr) -> None:
    """PostgreSQL's own ways out that SQLite lacks, refused before anything runs.

    On SQLite the authorizer refuses at run time any function not in SAFE_FUNCTIONS and the length limit
    caps every value; Postgres has neither, so what sqlglot parses into a known function (repeat, lpad,
    generate_series, regexp_replace) is checked here by the name Postgres runs it under. Names come from
    the node's class, not from generating its SQL: that would cost a statement's size for every call and
    operator in it (21 s for 1,600 ANDs).
    """
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
        reject(f"{node.sql(dialect='postgres')}: call functions by their name alone, without a schema")
    if isinstance(node, exp.Offset) and (_literal_int(node.expression) or 0) < 0:
        reject("OFFSET must not be negative")  # SQLite reads it as 0; Postgres would fail as it ran
    if isinstance(node, exp.SimilarTo):
        reject("SIMILAR TO is a regular expression; REGEXP is not available; use LIKE or strpos()")
    if isinstance(node, exp.DataType):
        # regclass, regrole, regproc...: casts that turn numbers into catalog names, and back.
        type_name = node.sql(dialect="postgres").lower().strip('"').rsplit(".", 1)[-1].strip('"')
        if type_name.startswith("reg"):
            reject(f"a cast to {type_name} looks names up in the server's catalogs; it is not available")
    if not isinstance(node, exp.Func) or isinstance(node, exp.Cast):
        return
    name = _postgres_function_name(node)
    if name.startswith("regexp_"):
        reject(f"REGEXP is not available ({name}()); use LIKE, strpos() or replace()")
    if name in POSTGRES_SERIES_BUILDERS:
        reject(f"function {name}() builds a series of any size; it is not available")
    if name in POSTGRES_SIZED_BUILDERS:
        # lpad and rpad return exactly the length asked; repeat multiplies its text (nested ones too).
        if isinstance(node, exp.Repeat):
            text, times = node.this, _literal_int(node.args.get("times"))
            unit = len(str(text.this).encode()) if isinstance(text, exp.Literal) and text.is_string else None
            size = None if unit is None or times is None else unit * times
        else:
            size = _literal_int(node.expression)
        if size is None or size > MAX_VALUE_BYTES:
            reject(
                f"{name}(): the value it builds must be known and at most {MAX_VALUE_BYTES} bytes "
                "(literal text and a literal count for repeat, a literal length for lpad and rpad)"
            )


def _postgres_function_name(node: exp.Func) -> str:
    """The name Postgres runs a parsed function under (sqlglot's Pad is lpad or rpad)."""
    if isinstance(node, exp.Pad):
        return "lpad" if node.args.get("is_left") else "rpad"
    if isinstance(node, exp.GenerateSeries | exp.ExplodingGenerateSeries):
        return "generate_series"
    return _function_name(node)


def _check_format(node: exp.Func) -> None:
    """printf/format: a literal format whose widths and precisions are literal and bounded.

    SQLite repeats a padded or '%.Nc' field in a C loop that neither the progress handler nor the value
    limit interrupts (3.40 keeps looping after the value outgrew SQLITE_LIMIT_LENGTH): printf('%.*c',
    900000000, 'x') ran for 14-21 s against a 2 s limit. So '*' and sizes past the value limit are refused.
    """
    fmt = node.this if isinstance(node, exp.Format) else next(iter(node.expressions), None)
    if not (isinstance(fmt, exp.Literal) and fmt.is_string):
        reject(f"{_function_name(node)}() needs a literal format string")
    for width, precision in _FORMAT_FIELD.findall(str(fmt.this)):
        if "*" in (width, precision):
            reject(f"{_function_name(node)}(): '*' widths and precisions are not allowed; write the number")
        if max(int(width or 0), int(precision or 0)) > MAX_VALUE_BYTES:
            reject(
                f"{_function_name(node)}(): a width or precision past {MAX_VALUE_BYTES} "
                "(the largest value a statement may build)"
            )


def _check_complexity(counts: dict[str, Any], complexity: Complexity) -> None:
    limits = COMPLEXITY[complexity]
    advice = f"max_sql_complexity {complexity!r} allows {limits.describe()}"
    for key, limit, one, many in (
        ("joins", limits.joins, "join", "joins"),
        ("subqueries", limits.subqueries, "subquery", "subqueries"),
        ("ctes", limits.ctes, "CTE", "CTEs"),
        ("set_operations", limits.set_operations, "UNION/INTERSECT/EXCEPT", "UNION/INTERSECT/EXCEPT"),
    ):
        if counts[key] > limit:
            reject(f"{counts[key]} {one if counts[key] == 1 else many}; {advice}")
    if counts["window_functions"] and not limits.window_functions:
        reject(f"window functions; {advice}")
    if counts["recursive"] and not limits.recursive:
        reject(f"a recursive CTE; {advice}")


def _apply_limit(root: exp.Expr, max_rows: int) -> tuple[int | None, int, int]:
    """Set LIMIT to the smaller of the query's own and max_rows (plus one row, to tell if rows were cut)."""
    limit = root.args.get("limit")
    query_limit: int | None = None
    if limit is not None:
        value = _literal_int(limit.expression)
        if value is None:
            reject("LIMIT must be a whole number")
        query_limit = value if value >= 0 else None  # SQLite reads a negative LIMIT as none
    offset = root.args.get("offset")
    if offset is not None and _literal_int(offset.expression) is None:
        reject("OFFSET must be a whole number")
    row_limit = max_rows if query_limit is None else min(query_limit, max_rows)
    fetch_limit = row_limit + 1 if query_limit is None or query_limit > max_rows else row_limit
    root.set("limit", exp.Limit(expression=exp.Literal.number(fetch_limit)))
    return query_limit, row_limit, fetch_limit


class SqlGate:
    """At most `limit` statements run at once; one that waits for a slot past its time limit is refused.

    A slot is held until the statement's thread really ends, also after the caller was answered at the
    time limit: that is what bounds the cores runaway statements can take from the rest of the worker.
    """

    def __init__(self, limit: int = DEFAULT_CONCURRENT_STATEMENTS) -> None:
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def acquire(self, timeout_s: float) -> None:
        """Take a slot, waiting at most timeout_s (cancellable); SQL_REJECTED if none frees up."""
        deadline = time.monotonic() + timeout_s
        while not self._slots.acquire(timeout=min(_WATCH_INTERVAL_S, max(deadline - time.monotonic(), 0))):
            check_cancelled()
            if time.monotonic() >= deadline:
                reject(
                    f"{self.limit} SQL statements are already running (SQL_MAX_CONCURRENT) and none "
                    f"finished within {round(timeout_s * 1000)} ms; try again shortly",
                    "execution",
                )

    def release(self) -> None:
        """Give the slot back (from the statement's own thread, when it ends)."""
        self._slots.release()


def select_limits(
    allowed: Collection[str], views: Collection[str], *, allow_recursive: bool, timeout_ms: int
) -> SelectLimits:
    """The run-time limits of a statement: these tables (views among them), SAFE_FUNCTIONS, bounded sizes."""
    return SelectLimits(
        allowed=frozenset(name.lower() for name in allowed),
        views=frozenset(name.lower() for name in views),
        functions=SAFE_FUNCTIONS,
        allow_recursive=allow_recursive,
        timeout_ms=timeout_ms,
        max_value_bytes=MAX_VALUE_BYTES,
        max_result_bytes=MAX_RESULT_BYTES,
        max_pattern_chars=MAX_PATTERN_CHARS,
        max_sql_chars=MAX_SQL_CHARS,
    )
