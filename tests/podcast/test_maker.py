"""rag_generate_podcast through the service: length within 25% of the request, not silence, two voices,
grounded in cited passages, cancellable, with progress; the LLM path against a fake LLM server."""

from __future__ import annotations

import array
import json
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_rag.cancellation import CancelToken, cancellation_scope
from iris_rag.embedder import Embedder
from iris_rag.errors import DocumentNotFoundError, InvalidParametersError, RequestCancelledError
from iris_rag.podcast.maker import PodcastRequest
from iris_rag.podcast.script import parse_script
from iris_rag.podcast.speech import rms
from iris_rag.progress import ProgressSink, progress_scope
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.fake_openai import FakeOpenAIServer
from tests.podcast.test_speech import median_pitch_hz
from tests.test_questions import TECHNIQUES, assert_model_mirrors_schema, sample_documents

TOPIC = "vitamin D and bone health"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("podcast")


@pytest.fixture(scope="module")
def loaded(data_dir: Path, embedder: Embedder) -> Iterator[RagService]:
    """A service whose collection 'sci' holds 60 SciFact abstracts."""
    service = RagService(Settings(RAG_DATA_DIR=data_dir, RAG_TECHNIQUES=TECHNIQUES), embedder=embedder)
    service.ingest({"collection_id": "sci", "documents": sample_documents(60)})
    yield service
    service.close()


def read_wav(path: Path) -> tuple[array.array[int], int]:
    with wave.open(str(path)) as audio:
        assert (audio.getnchannels(), audio.getsampwidth()) == (1, 2)
        samples = array.array("h", audio.readframes(audio.getnframes()))
        return samples, audio.getframerate()


def test_a_one_minute_podcast_is_a_minute_of_real_speech_in_two_voices(loaded: RagService) -> None:
    steps: list[tuple[int, str]] = []
    with progress_scope(ProgressSink(lambda n, message: steps.append((n, message)))):
        result = loaded.generate_podcast({"topic": TOPIC, "collection_id": "sci", "duration_minutes": 1})
    assert result["script_source"] == "extractive" and result["requested_s"] == 60
    samples, rate = read_wav(Path(result["audio_path"]))
    measured = len(samples) / rate
    assert abs(measured - 60) <= 0.25 * 60, measured
    assert result["duration_s"] == pytest.approx(measured, abs=0.01)
    assert rms(samples) > 500, "the audio is silence"
    assert Path(result["audio_path"]).parent == loaded.settings.data_dir / "podcasts"
    assert result["resource_uri"] == "rag://podcast/" + Path(result["audio_path"]).stem
    # Two speakers take turns; the opening says how the script was written.
    transcript = result["transcript"]
    assert {t["speaker"] for t in transcript} == {"host", "guest"}
    assert "no language model wrote it" in transcript[0]["text"]
    # Every guest answer is quoted from a cited source, and the sources are what the transcript cites.
    sources = {s["citation"]: s for s in result["sources"]}
    answers = [t for t in transcript if t["speaker"] == "guest"]
    assert answers and all(t["citations"] and set(t["citations"]) <= set(sources) for t in answers)
    for answer in answers:
        document = loaded.get_document(
            {"collection_id": "sci", "document_id": sources[answer["citations"][0]]["document_id"]}
        )
        quoted = answer["text"].rsplit(" [", 1)[0]
        assert quoted[:60] in " ".join(document["content"].split())
    # The host asks real questions.
    questions = [t["text"] for t in transcript[1:-1] if t["speaker"] == "host"]
    assert questions and all(q.endswith("?") for q in questions)
    assert result["speech"]["words_per_minute"] > 100
    # Progress was reported as it spoke, and only grew.
    assert any("spoken" in message for _, message in steps)
    assert [n for n, _ in steps] == sorted(n for n, _ in steps)
    # The resource lookup finds it; a name that is not one is refused.
    found = loaded.podcast_file({"name": Path(result["audio_path"]).stem})
    assert found["path"] == result["audio_path"] and found["mime_type"] == "audio/wav"
    for name in ["../iris_rag", "nope", ""]:
        with pytest.raises(DocumentNotFoundError):
            loaded.podcast_file({"name": name})


def test_host_and_guest_sound_different(loaded: RagService) -> None:
    """Each voice's pitch, measured on the podcast's own audio: the guest sits well above the host."""
    result = loaded.generate_podcast(
        {"topic": "gene expression", "collection_id": "sci", "duration_minutes": 1}
    )
    samples, rate = read_wav(Path(result["audio_path"]))
    voices: dict[str, array.array[int]] = {"host": array.array("h"), "guest": array.array("h")}
    for turn in result["transcript"]:
        assert 0 <= turn["start_s"] < turn["end_s"] <= result["duration_s"]
        voices[turn["speaker"]].extend(samples[round(turn["start_s"] * rate) : round(turn["end_s"] * rate)])
    host, guest = (median_pitch_hz(voices[s], rate) for s in ("host", "guest"))
    assert guest > 1.3 * host, (host, guest)


def test_cancelling_stops_the_speech(loaded: RagService) -> None:
    token = CancelToken()

    def cancel_after_a_turn(steps: int, message: str) -> None:
        if "spoken" in message:
            token.cancel()

    with (
        cancellation_scope(token),
        progress_scope(ProgressSink(cancel_after_a_turn)),
        pytest.raises(RequestCancelledError),
    ):
        loaded.generate_podcast({"topic": TOPIC, "collection_id": "sci", "duration_minutes": 30})
    assert not list((loaded.settings.data_dir / "podcasts").glob("*.part"))


def test_bad_requests_are_refused(loaded: RagService) -> None:
    refused: list[dict[str, Any]] = [
        {"topic": TOPIC, "duration_minutes": 0},
        {"topic": TOPIC, "duration_minutes": 31},
        {"topic": " "},
        {"topic": TOPIC, "voice": "x"},
    ]
    for arguments in refused:
        with pytest.raises(InvalidParametersError):
            loaded.generate_podcast(arguments)


def test_an_llm_script_is_spoken_and_a_short_one_is_made_up(
    loaded: RagService, data_dir: Path, embedder: Embedder
) -> None:
    script = (
        "**HOST:** Welcome back. What does the research say about vitamin D? [1]\n"
        "GUEST: Sunlight on the skin makes vitamin D, and the season and latitude change how much [1].\n"
        "Narrator: this line is not a speaker's and is dropped.\n"
        "HOST: And what about [99]?\n"
    )
    server = FakeOpenAIServer(reply=script)
    settings = Settings(
        RAG_DATA_DIR=data_dir,
        RAG_TECHNIQUES=TECHNIQUES,
        **server.llm_settings(),
    )
    service = RagService(settings, embedder=embedder)
    try:
        result = service.generate_podcast({"topic": TOPIC, "collection_id": "sci", "duration_minutes": 1})
    finally:
        service.close()
        server.close()
    # The fake repeats itself: the second call added nothing new, so extractive exchanges filled the minute.
    assert result["script_source"] == "llm+extractive"
    assert len([r for r in server.requests if r["path"].endswith("/chat/completions")]) == 2
    texts = [t["text"] for t in result["transcript"]]
    assert "written by a language model" in texts[0]
    assert texts[1] == "Welcome back. What does the research say about vitamin D? [1]"
    assert result["transcript"][3]["citations"] == []  # [99] is no passage
    assert abs(result["duration_s"] - 60) <= 15
    sidecar = json.loads(Path(result["audio_path"]).with_suffix(".json").read_text())
    assert sidecar["collection_id"] == "sci" and sidecar["transcript"] == result["transcript"]


def test_citations_to_passages_that_do_not_exist_leave_the_transcript(
    loaded: RagService, data_dir: Path, embedder: Embedder
) -> None:
    """[97], [98], [99]: no passage sent has them; the marks come out of the text, as out of citations."""
    script = (
        "HOST: Welcome.\nGUEST: Vitamin D reduces fractures [1]. Per [99], it cures everything.\n"
        "HOST: Interesting.\nGUEST: Glass blocks UVB [1][97], [1, 98] and [98, 99].\n"
    )
    server = FakeOpenAIServer(reply=script)
    settings = Settings(RAG_DATA_DIR=data_dir, RAG_TECHNIQUES=TECHNIQUES, **server.llm_settings())
    service = RagService(settings, embedder=embedder)
    try:
        result = service.generate_podcast({"topic": TOPIC, "collection_id": "sci", "duration_minutes": 1})
    finally:
        service.close()
        server.close()
    mapped = {s["citation"] for s in result["sources"]}
    texts = {t["text"] for t in result["transcript"]}
    assert "Vitamin D reduces fractures [1]. Per, it cures everything." in texts
    assert "Glass blocks UVB [1], [1] and." in texts
    for turn in result["transcript"]:
        cited = {int(n) for n in re.findall(r"\d+", " ".join(re.findall(r"\[[\d, ]+\]", turn["text"])))}
        assert cited <= mapped, turn


def test_citations_to_passages_cut_by_the_context_budget_leave_the_transcript(
    loaded: RagService, data_dir: Path, embedder: Embedder
) -> None:
    """LLM_CONTEXT_CHARS at its least sends one passage: [2] cites one the LLM never saw."""
    server = FakeOpenAIServer(reply="HOST: Welcome.\nGUEST: Vitamin D reduces fractures [1] and falls [2].\n")
    settings = Settings(
        RAG_DATA_DIR=data_dir, RAG_TECHNIQUES=TECHNIQUES, LLM_CONTEXT_CHARS=1000, **server.llm_settings()
    )
    service = RagService(settings, embedder=embedder)
    try:
        result = service.generate_podcast({"topic": TOPIC, "collection_id": "sci", "duration_minutes": 1})
    finally:
        service.close()
        server.close()
    prompt = server.requests[0]["body"]["messages"][1]["content"]
    assert prompt.count("<passage id=") == 1 and '<passage id="1"' in prompt
    [turn] = [t for t in result["transcript"] if t["text"].startswith("Vitamin D reduces")]
    assert (turn["text"], turn["citations"]) == ("Vitamin D reduces fractures [1] and falls.", [1])


def test_a_citation_right_after_a_word_is_cited_and_not_read_aloud() -> None:
    [turn] = parse_script("GUEST: It was warm[3], they said[9].", {3}, set())
    assert (turn.text, turn.citations, turn.spoken()) == (
        "It was warm[3], they said.",
        [3],
        "It was warm, they said.",
    )


def test_the_request_model_mirrors_the_schema() -> None:
    assert_model_mirrors_schema("rag_generate_podcast", PodcastRequest, set())


def test_an_off_topic_podcast_says_so(loaded: RagService) -> None:
    result = loaded.generate_podcast(
        {"topic": "the football world cup final", "collection_id": "sci", "duration_minutes": 1}
    )
    assert "nothing in the collection is close to this topic" in result["note"]


def test_a_collection_with_nothing_left_gives_a_short_podcast_that_says_so(loaded: RagService) -> None:
    loaded.ingest({"collection_id": "emptied", "documents": [{"id": "x", "content": "Gone soon."}]})
    loaded.delete_documents({"collection_id": "emptied", "document_ids": ["x"]})
    result = loaded.generate_podcast({"topic": TOPIC, "collection_id": "emptied", "duration_minutes": 1})
    assert [t["speaker"] for t in result["transcript"]] == ["host", "host"]
    assert "ran out of passages" in result["note"] and result["sources"] == []
