"""The embedding backends (EMBEDDING_BACKEND): ONNX Runtime gives torch's embeddings within 1e-4 cosine on
real texts, token-level work (ColBERT, word-piece counts) is unchanged under it, and the setting picks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from iris_rag import onnx_model
from iris_rag.embedder import Embedder, resolve_model_path
from iris_rag.errors import ModelUnavailableError
from iris_rag.settings import PACKAGED_MODEL_NAME, Settings
from iris_rag.techniques.colbert.index import TokenEncoder

ROOT = Path(__file__).resolve().parents[1]
COSINE_TOLERANCE = 1e-4  # issue 18's bar for an fp32 backend


def _sample_texts() -> list[str]:
    """Real texts: the bundled SciFact sample's abstracts (many beyond the 256-piece cut) and queries, and
    the edge cases of a tokenizer (empty, blank, one character, accents, symbols, other scripts)."""
    sample = ROOT / "samples" / "scifact"
    with (sample / "corpus.jsonl").open(encoding="utf-8") as corpus:
        abstracts = [json.loads(line)["text"] for line in corpus][:120]
    with (sample / "queries.jsonl").open(encoding="utf-8") as queries:
        questions = [json.loads(line)["text"] for line in queries][:40]
    edges = [
        "",
        "   ",
        "x",
        "  padded with spaces  ",
        "naïve Bayes — 5 µg/mL ≥ 3 \u00d7 10⁻⁶, café",
        "糖尿病とインスリン抵抗性",
        "COVID-19 🦠 vaccines",
        "word " * 600,
    ]
    return abstracts + questions + edges


@pytest.fixture(scope="module")
def onnx_embedder() -> Embedder:
    """EMBEDDING_BACKEND=onnx on the export scripts/setup.sh made."""
    embedder = Embedder(PACKAGED_MODEL_NAME, backend="onnx")
    embedder.load()
    embedder.wait_ready()
    assert embedder.backend == "onnx"
    return embedder


@pytest.fixture(scope="module")
def torch_embedder(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    """EMBEDDING_BACKEND=auto where no export exists: the sentence-transformers model on torch."""
    embedder = Embedder(PACKAGED_MODEL_NAME, onnx_dir=tmp_path_factory.mktemp("no-export"))
    embedder.load()
    embedder.wait_ready()
    assert embedder.backend == "torch", "auto without an export falls back to torch"
    return embedder


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a * b, axis=1)))


def test_onnx_embeddings_equal_torch_within_tolerance(
    onnx_embedder: Embedder, torch_embedder: Embedder
) -> None:
    texts = _sample_texts()
    bulk_onnx = onnx_embedder.encode(texts, bulk=True)
    bulk_torch = torch_embedder.encode(texts, bulk=True)
    assert bulk_onnx.shape == bulk_torch.shape == (len(texts), 384)
    assert bulk_onnx.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(bulk_onnx, axis=1), 1.0, atol=1e-5)
    assert 1 - _min_cosine(bulk_onnx, bulk_torch) < COSINE_TOLERANCE
    # One at a time on the query thread, as a technique's query is embedded.
    queries = texts[120:]
    one_by_one = np.stack([onnx_embedder.encode_query(q) for q in queries])
    assert 1 - _min_cosine(one_by_one, np.stack([torch_embedder.encode_query(q) for q in queries])) < (
        COSINE_TOLERANCE
    )
    # Batched with texts of other lengths (padding) or alone: the same vector.
    np.testing.assert_allclose(one_by_one, bulk_onnx[120:], atol=1e-5)
    # Different texts stay different: equality above is not a constant output.
    assert float(bulk_onnx[0] @ bulk_onnx[1]) < 0.9


def test_word_piece_counts_are_the_tokenizers(onnx_embedder: Embedder, torch_embedder: Embedder) -> None:
    texts = _sample_texts()
    counts = onnx_embedder.word_piece_counts(texts)
    assert counts == torch_embedder.word_piece_counts(texts)
    assert counts[-1] == 600 and max(counts) > 256, "not cut at the model's length"


def test_colbert_token_vectors_are_unchanged_under_onnx(
    onnx_embedder: Embedder, torch_embedder: Embedder
) -> None:
    """Token-level work gets the sentence-transformers model under onnx too (loaded when first asked for),
    and the dense vector ColBERT's ingest takes from its hidden states agrees with the ONNX encode."""
    texts = _sample_texts()[:30]
    under_onnx = TokenEncoder(onnx_embedder).encode(texts, with_dense=True)
    under_torch = TokenEncoder(torch_embedder).encode(texts, with_dense=True)
    for a, b in zip(under_onnx, under_torch, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-5)
    dense = onnx_embedder.encode(texts, bulk=True)
    compared = 0
    for row, tokens in zip(dense, under_onnx, strict=True):
        if tokens.dense is not None:
            assert 1 - float(row @ tokens.dense) < COSINE_TOLERANCE
            compared += 1
    assert compared > 5
    query = (
        TokenEncoder(onnx_embedder).encode_query("insulin resistance and diabetes", max_length=32).result()
    )
    assert query.dense is not None
    assert (
        1 - float(query.dense @ onnx_embedder.encode_query("insulin resistance and diabetes"))
        < COSINE_TOLERANCE
    )


def test_query_token_vectors_from_the_onnx_pass_equal_the_torch_pass(
    onnx_embedder: Embedder, torch_embedder: Embedder
) -> None:
    """rag_hybrid_ifind's rerank: the dense encode's ONNX pass gives the query's ColBERT token vectors,
    the same as the torch model's (torch's own shared pass: encode_query_shared falls back to it)."""
    assert torch_embedder.encode_query_states_async("a query") is None
    for query in _sample_texts()[120:130]:
        shared = TokenEncoder(onnx_embedder).encode_query_shared(query).result()
        torch = TokenEncoder(torch_embedder).encode_query_shared(query).result()
        np.testing.assert_array_equal(shared.tokens.token_ids, torch.tokens.token_ids)
        assert shared.tokens.vectors.shape[0] > 3
        assert 1 - _min_cosine(shared.tokens.vectors, torch.tokens.vectors) < COSINE_TOLERANCE
        assert shared.dense is not None and torch.dense is not None
        np.testing.assert_allclose(shared.dense, onnx_embedder.encode_query(query), atol=1e-6)
        assert 1 - float(shared.dense @ torch.dense) < COSINE_TOLERANCE


def test_onnx_without_an_export_fails_saying_how_to_export(tmp_path: Path) -> None:
    embedder = Embedder(PACKAGED_MODEL_NAME, backend="onnx", onnx_dir=tmp_path)
    embedder.load()
    assert embedder.state == "failed"
    with pytest.raises(ModelUnavailableError, match="export-onnx"):
        embedder.wait_ready()


def test_onnx_refuses_a_device_other_than_the_cpu() -> None:
    embedder = Embedder(PACKAGED_MODEL_NAME, backend="onnx", device="cuda")
    embedder.load()
    assert embedder.state == "failed"
    assert embedder.error is not None and "CPU only" in embedder.error


def test_the_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().embedding_backend, Settings().embedding_onnx_dir) == ("auto", None)
    monkeypatch.setenv("EMBEDDING_ONNX_DIR", "")  # as .env.template leaves it
    assert Settings().embedding_onnx_dir is None
    monkeypatch.setenv("EMBEDDING_BACKEND", "torch")
    monkeypatch.setenv("EMBEDDING_ONNX_DIR", "/somewhere/onnx")
    settings = Settings()
    assert (settings.embedding_backend, settings.embedding_onnx_dir) == ("torch", Path("/somewhere/onnx"))
    monkeypatch.setenv("EMBEDDING_BACKEND", "tensorrt")
    with pytest.raises(ValidationError, match="EMBEDDING_BACKEND"):
        Settings()


@pytest.fixture
def model_copy(tmp_path: Path) -> Iterator[Path]:
    """The packaged model's folder as links (its weights are not copied), to change one file of."""
    source = Path(resolve_model_path(PACKAGED_MODEL_NAME))
    target = tmp_path / "model"
    for path in source.rglob("*"):
        if path.is_file():
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(source)).symlink_to(path)
    yield target


def test_an_export_belongs_to_the_exact_model(model_copy: Path) -> None:
    original = onnx_model.model_fingerprint(resolve_model_path(PACKAGED_MODEL_NAME))
    assert onnx_model.model_fingerprint(model_copy) == original
    config = model_copy / "config.json"
    text = config.read_text()
    config.unlink()
    config.write_text(text.replace("}", ', "note": "changed"}', 1))
    assert onnx_model.model_fingerprint(model_copy) != original, "a changed model is not the exported one"


def test_only_mean_pooled_sentence_transformers_models_export(model_copy: Path, tmp_path: Path) -> None:
    assert onnx_model.pooling_config(model_copy) == (256, True)
    (model_copy / "modules.json").unlink()
    assert onnx_model.pooling_config(model_copy) == (0, False), "a plain folder keeps torch"
    assert onnx_model.pooling_config(tmp_path / "missing") == (0, False)
    with pytest.raises(ValueError, match="keeps the torch backend"):
        onnx_model.export(model_copy, tmp_path / "onnx")


def test_export_command_writes_a_loadable_export_once(tmp_path: Path, onnx_embedder: Embedder) -> None:
    """`python -m iris_rag.embedder export-onnx` (scripts/setup.sh's step) into EMBEDDING_ONNX_DIR."""
    env = {**os.environ, "EMBEDDING_ONNX_DIR": str(tmp_path / "onnx"), "LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "iris_rag.embedder", "export-onnx"]
    first = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True
    )
    assert "wrote" in first.stderr and first.stdout == ""
    again = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True
    )
    assert "already exported" in again.stderr
    exported = Embedder(PACKAGED_MODEL_NAME, backend="onnx", onnx_dir=tmp_path / "onnx")
    exported.load()
    text = "Insulin resistance precedes type 2 diabetes."
    assert 1 - float(exported.encode_query(text) @ onnx_embedder.encode_query(text)) < 1e-6


def _wait_for_export(embedder: Embedder, timeout_s: float = 300) -> str | None:
    deadline = time.monotonic() + timeout_s
    while embedder.onnx_export == "exporting" and time.monotonic() < deadline:
        time.sleep(0.5)
    return embedder.onnx_export


def test_a_start_without_an_export_serves_on_torch_and_exports_for_the_next(
    tmp_path: Path, onnx_embedder: Embedder
) -> None:
    """EMBEDDING_ONNX_EXPORT (an installed wheel ran no setup.sh): a first start exports in the background."""
    first = Embedder(PACKAGED_MODEL_NAME, onnx_dir=tmp_path / "onnx", export_onnx=True)
    first.load()
    assert first.backend == "torch" and first.onnx_export == "exporting"
    text = "Mitochondria are the powerhouse of the cell."
    served = first.encode_query(text)  # answers on torch while the export runs
    state = _wait_for_export(first)
    assert state is not None and state.startswith("exported: "), state
    assert not list((tmp_path / "onnx").rglob("*.partial")), "the export renames its files into place"

    second = Embedder(PACKAGED_MODEL_NAME, onnx_dir=tmp_path / "onnx", export_onnx=True)
    second.load()
    assert second.backend == "onnx" and second.onnx_export is None, "the next start loads the export"
    assert 1 - float(second.encode_query(text) @ served) < 1e-4
    assert 1 - float(second.encode_query(text) @ onnx_embedder.encode_query(text)) < 1e-6


def test_a_failed_background_export_keeps_serving_on_torch(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "onnx"
    not_a_folder.write_text("a file where the export folder would go")
    embedder = Embedder(PACKAGED_MODEL_NAME, onnx_dir=not_a_folder, export_onnx=True)
    embedder.load()
    state = _wait_for_export(embedder)
    assert state is not None and state.startswith("failed: "), state
    assert embedder.backend == "torch" and embedder.encode_query("still serving").shape == (384,)


def test_no_background_export_unless_asked(torch_embedder: Embedder) -> None:
    assert torch_embedder.backend == "torch" and torch_embedder.onnx_export is None


def test_long_texts_run_a_few_rows_per_pass_with_the_same_embeddings(monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's arena keeps its largest pass's memory: 16 chunks of 256 pieces in one left 300 MB."""
    path = resolve_model_path(PACKAGED_MODEL_NAME)
    export = onnx_model.find_export(path)
    assert export is not None
    model = onnx_model.OnnxModel(path, export, threads=1)
    texts = _sample_texts()[:40]  # abstracts: most fill the 256 word pieces
    passes: list[tuple[int, int]] = []  # rows, padded length
    run = model.session.run

    def counted(outputs: object, feeds: dict[str, np.ndarray]) -> object:
        passes.append(feeds["input_ids"].shape)
        return run(outputs, feeds)

    monkeypatch.setattr(model.session, "run", counted)
    capped = model.encode(texts, batch_size=16)
    assert max(length for _, length in passes) == 256
    assert all(rows * length**2 <= onnx_model.ATTENTION_CELLS_PER_RUN for rows, length in passes)
    model.encode(["a short query"] * 64, batch_size=64)  # short texts keep whole batches
    assert passes[-1][0] == 64
    monkeypatch.setattr(onnx_model, "ATTENTION_CELLS_PER_RUN", 1 << 40)
    passes.clear()
    whole = model.encode(texts, batch_size=16)
    assert max(rows for rows, _ in passes) == 16
    assert float(np.min(np.sum(capped * whole, axis=1))) > 1 - 1e-5
