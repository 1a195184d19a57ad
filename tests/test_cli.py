"""The `iris-rag` command's own checks: its arguments, and reading a folder that holds a FIFO."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from iris_rag import cli
from iris_rag.cli import build_parser
from iris_rag.errors import InvalidParametersError
from iris_rag.service import RagService
from tests.conftest import raise_unwritable_store
from tests.deadline import release_fifo, within


@pytest.mark.parametrize(
    ("option", "value", "limits"),
    [
        ("--chunk-size", "-5", "100-20000"),  # never finished chunking
        ("--chunk-size", "0", "100-20000"),  # was taken as the default
        ("--chunk-size", "1", "100-20000"),  # made one-character chunks
        ("--chunk-size", "20001", "100-20000"),
        ("--chunk-overlap", "-10", "0-5000"),
        ("--chunk-overlap", "5001", "0-5000"),
    ],
)
def test_ingest_chunking_out_of_the_settings_range_is_a_usage_error(
    option: str, value: str, limits: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["ingest", "docs", "--collection", "c", option, value])
    assert exited.value.code == 2
    assert f"argument {option}: {value} is out of range {limits}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-5", "20001"])
def test_eval_chunk_size_keeps_to_the_same_range(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["eval", "--dataset", "d", "--chunk-size", value])
    assert exited.value.code == 2
    assert f"argument --chunk-size: {value} is out of range 100-20000" in capsys.readouterr().err


def test_ingest_chunking_within_the_range_is_taken() -> None:
    args = build_parser().parse_args(
        ["ingest", "docs", "--collection", "c", "--chunk-size", "100", "--chunk-overlap", "0"]
    )
    assert (args.chunk_size, args.chunk_overlap) == (100, 0)


def test_ingest_refuses_an_overlap_not_under_the_size_before_reading(
    service: RagService, tmp_path: Path
) -> None:
    # Checked before any file is read: an empty folder, which reaches no ingest call, is refused too.
    argv = ["ingest", str(tmp_path), "--collection", "c", "--chunk-size", "200", "--chunk-overlap", "200"]
    args = build_parser().parse_args(argv)
    with pytest.raises(InvalidParametersError, match=r"chunk_overlap \(200\) must be smaller"):
        args.handler(args, service)
    assert service.list_collections({})["collections"] == []


def test_ingest_skips_a_fifo_in_the_folder(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ok.txt").write_text("A normal note about photosynthesis.", encoding="utf-8")
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    args = build_parser().parse_args(["ingest", str(tmp_path), "--collection", "c"])
    assert within(60, lambda: args.handler(args, service), unblock=release_fifo(pipe)) == 0
    out, err = capsys.readouterr()
    summary = orjson.loads(out)
    assert (summary["documents_ingested"], summary["files_skipped"]) == (1, 1)
    assert f"skipped {pipe}: not a regular file (a named pipe)" in err


def test_delete_with_a_filter_that_is_not_json_names_the_option(loaded_service: RagService) -> None:
    args = build_parser().parse_args(["delete", "--collection", "docs", "--filter", "{bad"])
    with pytest.raises(InvalidParametersError) as refused:
        args.handler(args, loaded_service)
    message = refused.value.message
    assert message.startswith("--filter is not valid JSON: ")
    assert "line 1 column 2" in message
    assert "\n" not in message
    assert len(loaded_service.list_documents({"collection_id": "docs"})["documents"]) == 3


def _ingest(service: RagService, path: Path, *options: str) -> int:
    args = build_parser().parse_args(["ingest", str(path), "--collection", "c", *options])
    code: int = args.handler(args, service)
    return code


def test_ingest_reports_a_file_name_that_is_not_utf8_and_ingests_the_rest(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.txt").write_text("A good file about the ocelot.", encoding="utf-8")
    with open(os.fsencode(tmp_path) + b"/caf\xe9.txt", "wb") as handle:
        handle.write(b"A Latin-1 named file about the quetzal.\n")
    assert _ingest(service, tmp_path) == 0
    out, err = capsys.readouterr()
    summary = orjson.loads(out)
    assert (summary["documents_ingested"], summary["files_skipped"]) == (1, 1)
    assert f"skipped {tmp_path}/caf\\xe9.txt: file name is not valid UTF-8; rename it" in err


def test_ingest_keeps_the_first_of_a_duplicate_id_whatever_the_batch(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "INGEST_BATCH", 2)  # the two lines land in different batches
    lines = ['{"_id": "far", "text": "First far."}']
    lines += [f'{{"_id": "n{i}", "text": "Filler record {i}."}}' for i in range(3)]
    lines += ['{"_id": "far", "text": "Second far."}', '{"text": "No id."}', '{"text": "No id."}']
    (tmp_path / "far.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert _ingest(service, tmp_path / "far.jsonl") == 0
    out, err = capsys.readouterr()
    summary = orjson.loads(out)
    assert (summary["documents_ingested"], summary["documents_skipped"]) == (5, 2)
    assert "skipped document far: document id 'far' appears more than once in this ingest" in err
    stored = service.store.get_document("c", "far")
    assert stored is not None and stored.content == "First far."
    assert len(service.store.document_ids("c")) == 5


@pytest.mark.parametrize("names", [["report.doc", "notes.rtf"], []])
def test_ingest_of_a_folder_without_supported_files_says_so_and_fails(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str], names: list[str]
) -> None:
    for name in names:
        (tmp_path / name).write_text("x", encoding="utf-8")
    assert _ingest(service, tmp_path) == 1
    out, err = capsys.readouterr()
    assert orjson.loads(out)["documents_ingested"] == 0
    assert f"skipped {tmp_path}: no files of a supported type (.csv, .docx" in err


def test_ingest_says_a_symlinked_subfolder_is_not_followed(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "shared.txt").write_text("Shared note about the serval.", encoding="utf-8")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "local.txt").write_text("Local note about the caracal.", encoding="utf-8")
    (tmp_path / "b" / "shared").symlink_to(tmp_path / "real", target_is_directory=True)
    assert _ingest(service, tmp_path / "b") == 0
    out, err = capsys.readouterr()
    assert orjson.loads(out)["documents_ingested"] == 1
    assert f"skipped {tmp_path / 'b' / 'shared'}: a symlink to a folder outside this one; not followed" in err


class _NoService:
    """Stands for RagService where a command's handler is replaced: nothing to open or close."""

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        pass

    def close(self) -> None:
        pass


def test_ctrl_c_prints_one_line_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(_args: object, _service: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(cli, "RagService", _NoService)
    monkeypatch.setattr(cli, "cmd_ingest", interrupted)
    assert cli.main(["ingest", str(tmp_path), "--collection", "c"]) == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["iris-rag: interrupted"]


def test_health_reports_a_model_that_cannot_load_as_unhealthy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`health` is what a container HEALTHCHECK runs: the report and status 1, not an error and status 2."""
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_TECHNIQUES", "basic")
    monkeypatch.setenv("EMBEDDING_BACKEND", "onnx")
    monkeypatch.setenv("EMBEDDING_ONNX_DIR", str(tmp_path / "no-export"))
    assert cli.main(["health"]) == 1
    out, err = capsys.readouterr()
    report = orjson.loads(out)
    assert report["status"] == "unhealthy"
    embedding = report["components"]["embedding_service"]
    assert (embedding["status"], embedding["details"]["state"]) == ("unhealthy", "failed")
    assert "has no ONNX export in" in embedding["error_message"]
    assert "error EMBEDDING_SERVICE_UNAVAILABLE" not in err
    # The reason is the message; a traceback of where it was raised adds nothing.
    failed = [r for r in caplog.records if r.name == "iris_rag.embedder" and "failed to load" in r.message]
    assert failed and not any(record.exc_info for record in failed)


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A structured table of collection shop in a fresh data folder, no LLM to write SQL."""
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_TECHNIQUES", "basic,sqlrag")
    monkeypatch.setenv("LLM_PROVIDER", "none")
    sales = tmp_path / "sales.csv"
    sales.write_text("region,amount\nnorth,10.5\nsouth,7.0\nnorth,3.0\nwest,99\n", encoding="utf-8")
    assert cli.main(["ingest-table", str(sales), "--table", "sales", "--collection", "shop"]) == 0


def test_query_sqlrag_without_an_llm_prints_the_tables_to_write_sql_over(
    shop: None, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert (
        cli.main(["query", "Which region sold the most?", "--technique", "sqlrag", "--collection", "shop"])
        == 2
    )
    err = capsys.readouterr().err
    assert "error INVALID_PARAMETERS: technique_params.sql is required" in err
    assert "write one SQLite SELECT over these tables and pass it with --sql:" in err
    assert "t_sales (4 rows; ingested from sales.csv)" in err
    assert "  region TEXT  e.g. 'north'" in err


def test_query_sqlrag_runs_the_sql_given_with_sql(shop: None, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    sql = "SELECT region, SUM(amount) AS total FROM t_sales GROUP BY region ORDER BY total DESC LIMIT 1"
    argv = ["query", "Which region sold the most?", "--technique", "sqlrag", "--collection", "shop"]
    assert cli.main([*argv, "--sql", sql, "--no-generate"]) == 0
    result = orjson.loads(capsys.readouterr().out)
    sql_run = result["metadata"]["technique_specific"]
    assert sql_run["sql_source"] == "caller"
    assert (sql_run["columns"], sql_run["rows"]) == (["region", "total"], [["west", 99.0]])


def test_sql_is_only_for_the_sqlrag_technique(shop: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["query", "anything", "--technique", "basic", "--sql", "SELECT 1"]) == 2
    assert "error INVALID_PARAMETERS: --sql is for --technique sqlrag" in capsys.readouterr().err


def test_a_store_that_cannot_be_written_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk under `iris-rag ingest` printed SQLite's traceback; MCP calls already got one code."""

    def unwritable(_args: object, _service: object) -> int:
        raise_unwritable_store()

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(cli, "RagService", _NoService)
    monkeypatch.setattr(cli, "cmd_ingest", unwritable)
    assert cli.main(["ingest", str(tmp_path), "--collection", "c"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error DATABASE_CONNECTION_FAILED: the SQLite store cannot be used")
    assert "RAG_DATA_DIR" in err and "Traceback" not in err and len(err.splitlines()) == 1
