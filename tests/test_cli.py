"""The `iris-rag` command's own checks: its arguments, and reading a folder that holds a FIFO."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from iris_rag.cli import build_parser
from iris_rag.errors import InvalidParametersError
from iris_rag.service import RagService
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
