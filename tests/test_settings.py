"""Where the settings come from: the environment over one .env file, empty meaning the default, RAG_DATA_DIR
resolved the same way by the CLI and the worker, and a bad value refused in one line naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from dotenv import dotenv_values

from iris_rag import settings as settings_module
from iris_rag.cli import main
from iris_rag.settings import Settings, SettingsError, default_data_dir, load_settings, read_dotenv

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run as an installed package started in a fresh folder: its .env is the one read."""
    monkeypatch.setattr(settings_module, "checkout_root", lambda: None)
    start = tmp_path / "start"
    start.mkdir()
    monkeypatch.chdir(start)
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    return start


def test_the_dotenv_of_the_start_folder_is_read_when_installed(
    installed: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tester's repro: a .env copied from the template was ignored without a word.
    (installed / ".env").write_text("CHUNK_SIZE=500\nCHUNK_OVERLAP=600\n", encoding="utf-8")
    assert main(["health", "--quick"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        "error: invalid configuration: CHUNK_OVERLAP (600) must be smaller than CHUNK_SIZE"
    )
    assert len(error.splitlines()) == 1


def test_a_checkout_reads_the_dotenv_at_its_root_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "checkout"
    root.mkdir()
    (root / ".env").write_text("RAG_DEFAULT_COLLECTION=from-dotenv\nCHUNK_SIZE=800\n", encoding="utf-8")
    monkeypatch.setattr(settings_module, "checkout_root", lambda: root)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAG_DEFAULT_COLLECTION", raising=False)
    monkeypatch.delenv("CHUNK_SIZE", raising=False)
    assert (load_settings().default_collection, load_settings().chunk_size) == ("from-dotenv", 800)
    # The environment wins over the file; a variable set empty there is as good as unset.
    monkeypatch.setenv("RAG_DEFAULT_COLLECTION", "from-env")
    monkeypatch.setenv("CHUNK_SIZE", "")
    assert (load_settings().default_collection, load_settings().chunk_size) == ("from-env", 800)


def test_a_dotenv_value_is_read_literally_and_empty_means_the_default(installed: Path) -> None:
    (installed / ".env").write_text(
        "# a comment\n"
        "export LLM_MODEL='my model' # a comment after the value\n"
        'LLM_BASE_URL="http://h/${HOME}/v1"\n'
        "EMBEDDING_DIMENSIONS=\n"
        "RAG_DEFAULT_COLLECTION=notes  # inline\n"
        "NOT_A_SETTING\n",
        encoding="utf-8",
    )
    assert read_dotenv(installed / ".env") == {
        "LLM_MODEL": "my model",
        "LLM_BASE_URL": "http://h/${HOME}/v1",
        "EMBEDDING_DIMENSIONS": "",
        "RAG_DEFAULT_COLLECTION": "notes",
    }
    loaded = load_settings()
    assert (loaded.llm_model, loaded.llm_base_url, loaded.embedding_dimensions) == (
        "my model",
        "http://h/${HOME}/v1",
        None,
    )
    assert loaded.default_collection == "notes"


def test_an_unreadable_dotenv_is_one_line_naming_it(installed: Path) -> None:
    (installed / ".env").mkdir()
    with pytest.raises(SettingsError, match=r"^could not read .*\.env: "):
        load_settings()


@pytest.mark.parametrize(
    "alias", sorted(str(field.validation_alias) for field in Settings.model_fields.values())
)
def test_every_empty_variable_means_its_default(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # EMBEDDING_DIMENSIONS= (as .env.template ships it) stopped the CLI and every MCP call.
    monkeypatch.setenv(alias, "")
    assert load_settings() == Settings()


def test_the_template_as_written_is_a_valid_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in dotenv_values(ROOT / ".env.template").items():
        monkeypatch.setenv(name, value or "")
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    assert load_settings().embedding_dimensions is None


def test_a_relative_data_dir_is_the_checkouts_wherever_the_cli_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker runs at the repository root; the CLI, started elsewhere, wrote <cwd>/data instead.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAG_DATA_DIR", raising=False)
    assert load_settings().database_path == ROOT / "data" / "iris_rag.sqlite3"
    monkeypatch.setenv("RAG_DATA_DIR", "stores/mine")
    assert load_settings().data_dir == ROOT / "stores" / "mine"
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "abs"))
    assert load_settings().data_dir == tmp_path / "abs"


def test_an_installed_package_takes_a_relative_data_dir_from_where_it_starts(
    installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_DATA_DIR", "mine")
    assert load_settings().data_dir.resolve() == (installed / "mine").resolve()
    monkeypatch.delenv("RAG_DATA_DIR")
    assert load_settings().data_dir == default_data_dir()


def test_an_unknown_log_level_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The CLI took it; every MCP call then failed with "ValueError: Unknown level: 'LOUD'".
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LOG_LEVEL", "LOUD")
    assert main(["health", "--quick"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: invalid configuration: LOG_LEVEL: ") and len(error.splitlines()) == 1
    monkeypatch.setenv("LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"


@pytest.mark.parametrize(
    ("variable", "bad", "good"),
    [
        # torch refuses "gpu" only when the model loads: every call was EMBEDDING_SERVICE_UNAVAILABLE.
        (
            "EMBEDDING_DEVICE",
            ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:0:1"],
            ["cpu", "cuda", "cuda:1", "mps", "xpu:0"],
        ),
        # No ingest can create such a collection, so every call naming none was COLLECTION_NOT_FOUND.
        (
            "RAG_DEFAULT_COLLECTION",
            ["my notes", ".hidden", "x" * 65, "é"],
            ["default", "scifact-sample", "a.b_c-1"],
        ),
    ],
)
def test_a_bad_device_or_default_collection_is_one_line_naming_it(
    variable: str,
    bad: list[str],
    good: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    for value in bad:
        monkeypatch.setenv(variable, value)
        assert main(["health", "--quick"]) == 2, value
        error = capsys.readouterr().err
        assert error.startswith(f"error: invalid configuration: {variable}: "), error
        assert len(error.splitlines()) == 1 and repr(value) not in error, error
    field = next(name for name, info in Settings.model_fields.items() if info.validation_alias == variable)
    for value in good:
        monkeypatch.setenv(variable, value)
        assert getattr(load_settings(), field) == value
