"""The `iris-rag` command: ingest files and ask questions without an MCP client."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

import orjson
from tqdm import tqdm

from iris_rag.backends import connection_failure
from iris_rag.embedder import Embedder, resolve_model_path
from iris_rag.errors import InvalidParametersError, ModelUnavailableError, RagError
from iris_rag.ingestion.ingestor import CHUNKING_RANGES, stored_id
from iris_rag.ingestion.loaders import (
    CsvColumns,
    NoSupportedFiles,
    SourceDocument,
    SourceError,
    iter_source,
    shown,
)
from iris_rag.ingestion.sync import sync_folder
from iris_rag.redaction import redact_logs
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings, SettingsError, load_settings

INGEST_BATCH = 256


def _batches(items: Iterator[SourceDocument], size: int) -> Iterator[list[SourceDocument]]:
    while batch := list(islice(items, size)):
        yield batch


def _chunking_value(name: str) -> Callable[[str], int]:
    """An argparse type for --chunk-size or --chunk-overlap: an integer within its setting's limits."""
    low, high = CHUNKING_RANGES[name]

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            msg = f"invalid int value: {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
        if not low <= value <= high:
            msg = f"{value} is out of range {low}-{high} (the limits of {name.upper()})"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def cmd_ingest(args: argparse.Namespace, service: RagService) -> int:
    """Read PATH and ingest it batch by batch, a progress bar on stderr and a summary at the end."""
    source_errors: list[SourceError] = []
    document_errors: list[dict[str, object]] = []
    no_files = False

    def skipped(item: SourceError) -> None:
        source_errors.append(item)
        tqdm.write(f"skipped {item.location}: {item.message}", file=sys.stderr)

    def documents() -> Iterator[SourceDocument]:
        nonlocal no_files
        columns = CsvColumns(args.text_column, args.id_column, args.title_column)
        seen: set[str] = set()  # ids already read: a later record with one is reported, whatever its batch
        for read in iter_source(Path(args.path), csv_columns=columns, report_empty=True):
            if isinstance(read, NoSupportedFiles):  # as rag_ingest's NO_FILES: no success, no file skipped
                no_files = True
                tqdm.write(f"skipped {read.location}: {read.message}", file=sys.stderr)
            elif isinstance(read, SourceError):
                skipped(read)
            elif (document_id := stored_id(read)) in seen:
                message = f"document id {document_id!r} appears more than once in this ingest"
                message += "; the first is kept"
                document_errors.append(
                    {"index": None, "id": read.id, "code": "DUPLICATE_DOCUMENT_ID", "message": message}
                )
                tqdm.write(f"skipped document {read.id}: {message}", file=sys.stderr)
            else:
                seen.add(document_id)
                yield read

    started = time.perf_counter()
    ingested = chunks = 0
    service.embedder.wait_ready()
    # Refused before any file is read: an overlap not under the size, which the options alone cannot tell.
    service.ingestor.chunking(args.chunk_size, args.chunk_overlap)
    with tqdm(desc=f"ingest {args.collection}", unit="doc", file=sys.stderr, dynamic_ncols=True) as bar:
        for batch in _batches(documents(), INGEST_BATCH):
            result = service.ingestor.ingest(
                args.collection, batch, chunk_size=args.chunk_size, chunk_overlap=args.chunk_overlap
            )
            ingested += len(result.document_ids)
            chunks += result.chunks_created
            document_errors.extend(result.errors)
            for error in result.errors:
                tqdm.write(f"skipped document {error['id']}: {error['message']}", file=sys.stderr)
            bar.update(len(batch))
    core_elapsed = time.perf_counter() - started
    service.wait_for_indexes(args.collection)  # INDEX_BUILD=background: the command ends with them built
    elapsed = time.perf_counter() - started
    summary = {
        "collection": args.collection,
        "documents_ingested": ingested,
        "chunks_created": chunks,
        "files_skipped": len(source_errors),
        "documents_skipped": len(document_errors),
        "seconds": round(elapsed, 2),
        "chunks_per_second": round(chunks / elapsed, 1) if elapsed else None,
        **({"core_seconds": round(core_elapsed, 2)} if service.index_builder is not None else {}),
    }
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    return 0 if ingested or not (source_errors or document_errors or no_files) else 1


def cmd_sync(args: argparse.Namespace, service: RagService) -> int:
    """Bring a collection up to date with a folder; one summary line, exit 1 if any file failed."""
    if not args.dry_run:
        service.embedder.wait_ready()
    columns = CsvColumns(args.text_column, args.id_column, args.title_column)
    report = sync_folder(
        Path(args.folder),
        args.collection,
        store=service.store,
        ingestor=service.ingestor,
        dry_run=args.dry_run,
        csv_columns=columns,
    )
    if not args.dry_run:
        service.wait_for_indexes(args.collection)
    for error in report.errors:
        print(f"error {error.location}: {error.message}", file=sys.stderr)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    print(
        f"sync {shown(args.folder)} -> {args.collection}{' (dry run)' if args.dry_run else ''}: "
        f"{report.summary()}"
    )
    return 1 if report.errors else 0


def cmd_ingest_table(args: argparse.Namespace, service: RagService) -> int:
    """Load a CSV or JSON-lines file as structured table t_<table> for rag_sqlrag (replacing it)."""
    from iris_rag.errors import PipelineNotFoundError
    from iris_rag.techniques.sqlrag.pipeline import SqlRagPipeline

    pipeline = service.pipelines.get(SqlRagPipeline.technique)
    if not isinstance(pipeline, SqlRagPipeline):
        msg = "the sqlrag technique is not served, so there is nothing to query tables with"
        raise PipelineNotFoundError(msg)
    summary = pipeline.ingest_table_file(Path(args.path), args.table, args.collection)
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_query(args: argparse.Namespace, service: RagService) -> int:
    """Run one technique and print the response as JSON."""
    if args.sql is not None and args.technique != "sqlrag":
        msg = f"--sql is for --technique sqlrag, not {args.technique}"
        raise InvalidParametersError(msg)
    arguments = {
        "query": args.query,
        "options": {"top_k": args.top_k, "generate": not args.no_generate},
        **({"collection_id": args.collection} if args.collection else {}),
        **({"technique_params": {"sql": args.sql}} if args.sql is not None else {}),
    }
    service.embedder.wait_ready()
    result = service.execute({"technique": args.technique, "arguments": arguments})
    if args.answer_only:
        print(result["answer"])
    else:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_reindex(args: argparse.Namespace, service: RagService) -> int:
    """Rebuild a collection's keyword rows and technique indexes from its stored documents."""
    service.embedder.wait_ready()
    summary = service.reindex(args.collection)
    service.wait_for_indexes(args.collection)
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_documents(args: argparse.Namespace, service: RagService) -> int:
    """List a collection's documents (rag_list_documents), one page."""
    arguments = {"collection_id": args.collection, "limit": args.limit, "cursor": str(args.offset)}
    print(orjson.dumps(service.list_documents(arguments), option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_delete(args: argparse.Namespace, service: RagService) -> int:
    """Delete documents by id or by metadata filter (rag_delete_documents)."""
    arguments: dict[str, object] = {"collection_id": args.collection}
    if args.filter is not None:
        try:
            arguments["filter"] = orjson.loads(args.filter)
        except orjson.JSONDecodeError as exc:
            msg = f"--filter is not valid JSON: {exc}"
            raise InvalidParametersError(msg) from None
    if args.ids:
        arguments["document_ids"] = args.ids
    result = service.delete_documents(arguments)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_delete_collection(args: argparse.Namespace, service: RagService) -> int:
    """Delete a whole collection (rag_delete_collection); --yes confirms."""
    if not args.yes:
        print(f"this deletes collection {args.collection!r} and everything in it; add --yes to confirm")
        return 2
    arguments = {"collection_id": args.collection, "confirm_collection_id": args.collection}
    print(orjson.dumps(service.delete_collection(arguments), option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_describe(args: argparse.Namespace, service: RagService) -> int:
    """Set a collection's description (rag_update_collection)."""
    arguments = {"collection_id": args.collection, "description": args.description}
    print(orjson.dumps(service.update_collection(arguments), option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_health(args: argparse.Namespace, service: RagService) -> int:
    """Print the health report; exit 1 when unhealthy (a container HEALTHCHECK)."""
    if args.quick:
        # Without loading the model (seconds of CPU): the store answers and the model files are there.
        service.store.ping()
        report: dict[str, object] = {"status": "healthy", "database": "ok"}
        if service.settings.embedding_provider == "local":
            report["model_path"] = resolve_model_path(service.settings.embedding_model)
        else:  # an embedding API: nothing local to check without a request
            report["embedding_model"] = service.settings.embedding_model_id
    else:
        # A model that cannot load is the report's to tell (embedding_service unhealthy, exit 1).
        with contextlib.suppress(ModelUnavailableError):
            service.embedder.wait_ready()
        report = service.health_check({"include_details": True})
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 1 if report["status"] == "unhealthy" else 0


def _require_writable_folder(folder: Path) -> None:
    """Make the folder (and its parents) or refuse, naming it, unless this process may write in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot write to {folder}: {exc.strerror or exc}"
        raise InvalidParametersError(msg) from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        msg = f"cannot write to {folder}: permission denied"
        raise InvalidParametersError(msg)


def cmd_eval(args: argparse.Namespace, service: RagService) -> int:
    """Score techniques on a BEIR folder: a table on stdout, progress on stderr, the report with --out."""
    # Imported here so that the other commands never load pytrec_eval.
    import shlex

    from iris_rag.evaluation import harness, techniques
    from iris_rag.evaluation.beir import load_beir
    from iris_rag.evaluation.collection import collection_name
    from iris_rag.evaluation.metrics import DEEPEST_CUTOFF
    from iris_rag.evaluation.report import format_table, machine, write_report

    # Like the other commands, wait for the model first: an interpreter exiting on an early error while the
    # model still loads in the background prints a spurious traceback.
    service.embedder.wait_ready()
    if args.k < DEEPEST_CUTOFF:
        msg = (
            f"--k must be at least {DEEPEST_CUTOFF}: Recall@{DEEPEST_CUTOFF} needs that many documents ranked"
        )
        raise InvalidParametersError(msg)
    if args.limit_queries is not None and args.limit_queries < 1:
        msg = "--limit-queries must be at least 1"
        raise InvalidParametersError(msg)
    specs = techniques.resolve(args.techniques, service.pipelines, techniques.parse_params(args.params))
    runs = Path(args.runs) if args.runs else None
    # Before the run, which can take an hour: a report it cannot write would be lost at its end.
    for folder in (Path(args.out).parent if args.out else None, runs):
        if folder is not None:
            _require_writable_folder(folder)
    dataset = load_beir(Path(args.dataset), args.split)
    if dataset.duplicate_ids:
        shown_ids = ", ".join(dataset.duplicate_ids[:5])
        print(
            f"eval: {len(dataset.duplicate_ids)} corpus ids are on more than one line ({shown_ids}); "
            "the last line of each is the document, as in BEIR's loader",
            file=sys.stderr,
        )
    if args.limit_queries is not None:
        dataset = dataset.limited(args.limit_queries)
    chunk_size = service.settings.chunk_size if args.chunk_size is None else args.chunk_size
    collection = args.collection or collection_name(dataset.name, chunk_size, service.settings.chunk_overlap)
    report = harness.evaluate(
        service, dataset, specs, k=args.k, collection_id=collection, chunk_size=chunk_size, runs=runs
    )
    command = ["iris-rag", "eval", "--dataset", args.dataset, "--techniques", args.techniques]
    command += ["--k", str(args.k), "--split", args.split]
    command += ["--chunk-size", str(args.chunk_size)] if args.chunk_size is not None else []
    command += ["--limit-queries", str(args.limit_queries)] if args.limit_queries else []
    command += [f"--params={item}" for item in args.params]
    command += ["--collection", args.collection] if args.collection else []
    command += ["--runs", args.runs] if args.runs else []
    report |= {"command": shlex.join(command), "machine": machine()}
    print(format_table(report["techniques"]))
    if args.out:
        write_report(Path(args.out), report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="iris-rag", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    ingest = commands.add_parser(
        "ingest", help="ingest a file or a folder: .txt, .md, .html, .pdf, .docx, BEIR .jsonl, .csv"
    )
    ingest.add_argument("path")
    ingest.add_argument("--collection", required=True)
    ingest.add_argument(
        "--chunk-size",
        type=_chunking_value("chunk_size"),
        default=None,
        help="characters per chunk, 100-20000 (default CHUNK_SIZE)",
    )
    ingest.add_argument(
        "--chunk-overlap",
        type=_chunking_value("chunk_overlap"),
        default=None,
        help="characters repeated between chunks, 0-5000, under the size (default CHUNK_OVERLAP)",
    )
    ingest.add_argument("--text-column", default="text", help="CSV column holding the text")
    ingest.add_argument("--id-column", default="id", help="CSV column holding the document id")
    ingest.add_argument("--title-column", default="title", help="CSV column holding the title")
    ingest.set_defaults(handler=cmd_ingest)

    sync = commands.add_parser(
        "sync", help="ingest a folder's new and changed files, delete the documents of removed ones"
    )
    sync.add_argument("folder")
    sync.add_argument("--collection", required=True)
    sync.add_argument("--dry-run", action="store_true", help="count what would change; change nothing")
    sync.add_argument("--text-column", default="text", help="CSV column holding the text")
    sync.add_argument("--id-column", default="id", help="CSV column holding the document id")
    sync.add_argument("--title-column", default="title", help="CSV column holding the title")
    sync.set_defaults(handler=cmd_sync)

    ingest_table = commands.add_parser(
        "ingest-table", help="load a .csv/.tsv or .jsonl file as a structured table for rag_sqlrag"
    )
    ingest_table.add_argument("path")
    ingest_table.add_argument(
        "--table", required=True, help="table name, queried as t_<table>; ingesting it again replaces it"
    )
    ingest_table.add_argument(
        "--collection", default=None, help="collection the table belongs to (default: shared by all)"
    )
    ingest_table.set_defaults(handler=cmd_ingest_table)

    query = commands.add_parser("query", help="ask a question with one technique")
    query.add_argument("query")
    query.add_argument("--technique", default="basic")
    query.add_argument("--collection", default=None)
    query.add_argument("--top-k", type=int, default=5)
    query.add_argument("--no-generate", action="store_true", help="return the evidence only")
    query.add_argument("--answer-only", action="store_true", help="print only the answer text")
    query.add_argument(
        "--sql",
        default=None,
        help="for --technique sqlrag: the SELECT to run (needed without an LLM; an error lists the tables)",
    )
    query.set_defaults(handler=cmd_query)

    reindex = commands.add_parser(
        "reindex", help="rebuild a collection's indexes (after an upgrade adds one)"
    )
    reindex.add_argument("--collection", required=True)
    reindex.set_defaults(handler=cmd_reindex)

    documents = commands.add_parser("documents", help="list a collection's documents, a page at a time")
    documents.add_argument("--collection", required=True)
    documents.add_argument("--limit", type=int, default=50)
    documents.add_argument("--offset", type=int, default=0, help="documents to skip (next_cursor of a page)")
    documents.set_defaults(handler=cmd_documents)

    delete = commands.add_parser(
        "delete", help="delete documents by id, or every one a metadata filter matches"
    )
    delete.add_argument("ids", nargs="*", help="document ids")
    delete.add_argument("--collection", required=True)
    delete.add_argument(
        "--filter", default=None, help='metadata filter as JSON, e.g. \'{"year": {"lt": 2000}}\''
    )
    delete.set_defaults(handler=cmd_delete)

    drop = commands.add_parser("delete-collection", help="delete a collection and everything in it")
    drop.add_argument("collection")
    drop.add_argument("--yes", action="store_true", help="confirm")
    drop.set_defaults(handler=cmd_delete_collection)

    describe = commands.add_parser("describe", help="set a collection's description")
    describe.add_argument("collection")
    describe.add_argument("description")
    describe.set_defaults(handler=cmd_describe)

    health = commands.add_parser("health", help="check the store and the model; exit 1 when unhealthy")
    health.add_argument("--quick", action="store_true", help="skip loading the model (for container checks)")
    health.set_defaults(handler=cmd_health)

    evaluate = commands.add_parser("eval", help="score techniques on a BEIR folder (nDCG@10, recall, MRR@10)")
    evaluate.add_argument("--dataset", required=True, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/")
    evaluate.add_argument("--techniques", default="basic", help="comma-separated names, or all")
    evaluate.add_argument("--k", type=int, default=100, help="documents ranked per query, at least 100")
    evaluate.add_argument("--out", default=None, help="write the report as JSON here")
    evaluate.add_argument(
        "--runs",
        default=None,
        metavar="DIR",
        help="write each technique's ranking as a TREC run file, DIR/<technique>.run, and DIR/qrels.txt",
    )
    evaluate.add_argument(
        "--split", default="test", help="qrels/<split>.tsv (train for tuning, test to report)"
    )
    evaluate.add_argument(
        "--chunk-size",
        type=_chunking_value("chunk_size"),
        default=None,
        help="characters per chunk, 100-20000 (default CHUNK_SIZE)",
    )
    evaluate.add_argument("--limit-queries", type=int, default=None, help="only the first N queries")
    evaluate.add_argument(
        "--params",
        action="append",
        default=[],
        metavar="TECHNIQUE=JSON",
        help="technique_params for one technique, e.g. hybrid_ifind='{\"vector_weight\":0.6}' (repeatable)",
    )
    evaluate.add_argument("--collection", default=None, help="collection to use (default eval-<folder>)")
    evaluate.set_defaults(handler=cmd_eval)

    migrate = commands.add_parser(
        "migrate",
        help="copy collections to another store: vectors and technique rows as stored, nothing re-embedded",
    )
    migrate.add_argument(
        "--from",
        dest="source",
        required=True,
        help="sqlite:PATH (the file or its RAG_DATA_DIR folder), postgres:URL, or iris: (IRIS_* variables)",
    )
    migrate.add_argument("--to", dest="target", required=True, help="the target store, in the same forms")
    migrate.add_argument(
        "--collection", action="append", default=None, help="copy only this collection (repeatable)"
    )
    migrate.add_argument(
        "--skip-technique",
        action="append",
        default=[],
        metavar="TECHNIQUE",
        help="leave this technique's rows behind (colbert, noderag, graphrag, sqlrag); reindex it later",
    )
    migrate.add_argument(
        "--replace",
        action="store_true",
        help="overwrite collections the target already holds (refused otherwise)",
    )

    mcp = commands.add_parser(
        "mcp", help="serve MCP (Node 20+ runs the bundled front end; this Python runs the worker)"
    )
    mcp.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default=None,
        help="stdio (default) or Streamable HTTP (MCP_SERVER_HOST, MCP_SERVER_PORT); sets MCP_TRANSPORT",
    )
    return parser


def cmd_migrate(args: argparse.Namespace) -> int:
    """Copy collections between stores, each all-or-nothing; a JSON summary line per collection on stdout."""
    from iris_rag.migration import StoreSpec, migrate, opened

    try:
        settings = load_settings()
    except SettingsError as exc:
        raise InvalidParametersError(str(exc)) from None
    source, target = StoreSpec.parse(args.source), StoreSpec.parse(args.target)
    if source.same_store(target):
        msg = f"--from and --to are the same store ({source.describe()})"
        raise InvalidParametersError(msg)
    with (
        opened(source, settings, must_exist=True) as source_store,
        opened(target, settings, must_exist=False) as target_store,
        tqdm(desc="migrate", unit="doc", file=sys.stderr, dynamic_ncols=True) as bar,
    ):
        copies = migrate(
            source_store,
            target_store,
            args.collection,
            replace=args.replace,
            skip=frozenset(t.strip() for item in args.skip_technique for t in item.split(",") if t.strip()),
            progress=lambda _collection, documents: bar.update(documents),
        )
    for copy in copies:
        print(orjson.dumps(copy.to_dict()).decode())
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve MCP: the bundled Node front end, its worker run by this Python (never returns on POSIX)."""
    from iris_rag.launcher import LaunchError, serve

    try:
        return serve(args.transport)
    except LaunchError as exc:
        print(f"iris-rag mcp: {exc}", file=sys.stderr)
        return 2


def _idle_embedder(settings: Settings) -> Embedder:
    return Embedder(settings.embedding_model, batch_size=settings.embedding_batch_size)


def _serving_only_evaluated(settings: Settings, requested: str) -> Settings:
    """For eval: serve only the techniques it scores, so only their indexes are built and waited for.

    `--techniques basic` on a large corpus would otherwise wait for GraphRAG's, NodeRAG's and ColBERT's
    index builds too. Left as configured for `all`, or when a name is unknown (the error then lists every
    technique); an index left unbuilt is built by a later eval that scores its technique.
    """
    from iris_rag.evaluation.techniques import VARIANTS
    from iris_rag.techniques.registry import PIPELINES

    names = [name.strip() for name in requested.split(",") if name.strip()]
    bases = list(dict.fromkeys(VARIANTS[name][0] if name in VARIANTS else name for name in names))
    served = settings.served_techniques or list(PIPELINES)
    if requested.strip() == "all" or not bases or any(base not in served for base in bases):
        return settings
    return settings.model_copy(update={"techniques": ",".join(bases)})


def _print_tables(exc: RagError) -> None:
    """The tables of a rag_sqlrag error that asks for SQL (its details.schema), to write --sql over."""
    schema = exc.details.get("schema")
    if not isinstance(schema, list) or not schema:
        return
    from iris_rag.techniques.sqlrag.safety import dialect_name
    from iris_rag.techniques.sqlrag.schema import schema_text

    rules = exc.details.get("rules")
    dialect = dialect_name(str(rules.get("dialect", ""))) if isinstance(rules, dict) else "SQL"
    print(f"write one {dialect} SELECT over these tables and pass it with --sql:", file=sys.stderr)
    print(schema_text(schema), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; Ctrl-C ends it with one line and status 130, not a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # An ingest's batches already committed stay; the one in progress is rolled back.
        print("iris-rag: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "mcp":
        # The worker builds its own settings and store; this process only becomes the front end.
        return cmd_mcp(args)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.command == "migrate":
        # Two stores and no model: nothing is embedded, so no service.
        redact_logs()
        try:
            return cmd_migrate(args)
        except RagError as exc:
            print(f"error {exc.code}: {exc.message}", file=sys.stderr)
            return 2
        except ConnectionError as exc:  # a store server that is not there (its message names it, no secret)
            print(f"error: {exc}", file=sys.stderr)
            return 2
    limit_blas_threads()
    try:
        settings = load_settings()
    except SettingsError as exc:  # one line naming the variable, not pydantic's dump of the environment
        print(f"error: {exc}", file=sys.stderr)
        return 2
    redact_logs(settings.llm_secrets)
    if args.command == "eval":
        settings = _serving_only_evaluated(settings, args.techniques)
    # Only commands that embed need the model loaded; `health --quick` must stay light.
    embedder = None if args.command != "health" or not args.quick else _idle_embedder(settings)
    # The commands that write build the indexes their collection lacks, and wait for them (eval queues its
    # collection's once it knows it); the others build none: they would abandon the builds at exit.
    index_scan = [args.collection] if args.command in {"ingest", "sync", "reindex"} else []
    try:
        service = RagService(settings, embedder=embedder, index_scan=index_scan)
    except RagError as exc:  # DATABASE_CONNECTION_FAILED, say: the code and reason, not a traceback
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except SettingsError as exc:  # techniques this configuration cannot serve
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        code: int = args.handler(args, service)
    except RagError as exc:
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        _print_tables(exc)
        code = 2
    except Exception as exc:  # a store that cannot be used (a full disk, a lost server): named, no traceback
        failure = connection_failure(exc, settings.llm_secrets)
        if failure is None:
            raise
        print(f"error {failure.code}: {failure.message}", file=sys.stderr)
        code = 2
    finally:
        service.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
