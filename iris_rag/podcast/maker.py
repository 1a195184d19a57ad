"""Make a podcast: retrieve, write the script, speak it in two voices up to the requested length, save it.

Speech runs a sentence at a time and stops once the requested duration (less the closing line) is spoken,
so the measured length lands within about one sentence of the request, whatever the engine's pace. Work is
bounded by the duration (at most 30 minutes of audio), cancellable between sentences, and reported as
progress (iris_rag/progress.py), which also keeps a long call from timing out while it speaks.
"""

from __future__ import annotations

import array
import json
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from iris_rag import access, progress
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import DocumentNotFoundError
from iris_rag.generation import RELEVANCE_FLOOR
from iris_rag.llm import TechniqueLLM
from iris_rag.pipeline import Pipeline, RetrievedDocument
from iris_rag.podcast import script
from iris_rag.podcast.script import Citations, Turn
from iris_rag.podcast.speech import GUEST, HOST, engine, silence, write_wav
from iris_rag.questions import choose_retriever
from iris_rag.stores.base import CollectionInfo
from iris_rag.text import split_sentences

MIME_TYPE = "audio/wav"
RESOURCE_PREFIX = "rag://podcast/"
SENTENCE_PAUSE_S = 0.25
TURN_PAUSE_S = 0.6
# A host question is only asked with room left for this much answer.
MIN_ANSWER_S = 6.0
# Passages retrieved per requested minute (an exchange quotes about one passage in 20-30 seconds).
PASSAGES_PER_MINUTE = 4
MAX_PASSAGES = 150
# LLM calls to reach the length (the first, then continuations).
MAX_LLM_CALLS = 4
# Characters of one sentence given to the engine at once (a runaway "sentence" is cut).
MAX_SENTENCE_CHARS = 600
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")


class PodcastRequest(BaseModel):
    """rag_generate_podcast's arguments (schema: schemas/tools/rag_generate_podcast.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str = Field(min_length=1, max_length=500)
    collection_id: str | None = None
    duration_minutes: int = Field(5, ge=1, le=30)


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return slug or "podcast"


def podcast_dir(data_dir: Path) -> Path:
    """Where podcasts are saved: RAG_DATA_DIR/podcasts."""
    return data_dir / "podcasts"


class PodcastMaker:
    """Writes, speaks and saves podcasts for the service."""

    def __init__(self, pipelines: Mapping[str, Pipeline], llm: TechniqueLLM, data_dir: Path) -> None:
        self.pipelines = pipelines
        self.llm = llm
        self.directory = podcast_dir(data_dir)

    def run(self, request: PodcastRequest) -> dict[str, Any]:
        """The podcast for the topic: its file, resource URI, transcript, sources and measured duration."""
        pipeline = choose_retriever(self.pipelines)
        collection = pipeline.resolve_collection(request.collection_id)
        target_s = request.duration_minutes * 60.0
        progress.stage("podcast: retrieving passages")
        passages = self._passages(pipeline, collection, request.topic, request.duration_minutes)
        citations = Citations()
        llm_error: str | None = None
        source = "extractive"
        turns: Iterator[Turn]
        if self.llm.available:
            progress.stage("podcast: writing the script")
            written, llm_error = self._llm_turns(request.topic, passages, citations, target_s)
            if written:
                source = "llm"
                # When the LLM's script is shorter than asked, extractive exchanges on the passages it did not
                # cite make up the rest (and the source says so).
                cited = {
                    d for d, n in citations.numbers.items() if n in {c for t in written for c in t.citations}
                }
                rest = [d for d in passages if d.chunk.document_id not in cited]
                turns = _chain(written, script.extractive_exchanges(rest, citations))
        if source == "extractive":
            turns = script.extractive_exchanges(passages, citations)
        progress.stage("podcast: speaking")
        spoken, samples, sample_rate, added = self._speak(request.topic, source, turns, target_s)
        if source == "llm" and added:
            source = "llm+extractive"
        duration_s = len(samples) / sample_rate
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{_slug(collection.id, 24)}-{_slug(request.topic, 32)}-{stamp}-{secrets.token_hex(3)}"
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.wav"
        write_wav(path, samples, sample_rate)
        cited_numbers = {c for t in spoken for c in t.citations}
        words = script.word_count(spoken)
        result: dict[str, Any] = {
            "collection_id": collection.id,
            "topic": request.topic,
            "script_source": source,
            "audio_path": str(path),
            "resource_uri": f"{RESOURCE_PREFIX}{name}",
            "mime_type": MIME_TYPE,
            "duration_s": round(duration_s, 2),
            "requested_s": target_s,
            "speech": {
                "engine": "espeak-ng",
                "sample_rate": sample_rate,
                "words": words,
                "words_per_minute": round(60 * words / duration_s, 1) if duration_s else 0.0,
                "voices": [HOST.describe(), GUEST.describe()],
            },
            "transcript": [
                {
                    "speaker": t.speaker,
                    "text": t.text,
                    "citations": t.citations,
                    "start_s": round(t.start_s, 2),
                    "end_s": round(t.end_s, 2),
                }
                for t in spoken
            ],
            "sources": citations.sources(cited_numbers),
            **({"llm_error": llm_error} if llm_error else {}),
        }
        notes = []
        best = max((d.score for d in passages), default=0.0)
        if passages and best < RELEVANCE_FLOOR:
            notes.append(
                f"nothing in the collection is close to this topic (best similarity {best:.2f}, below "
                f"{RELEVANCE_FLOOR}): the podcast talks about the nearest passages, probably unrelated"
            )
        if duration_s < 0.75 * target_s:
            notes.append(
                f"the collection ran out of passages on this topic after {duration_s:.0f} s of the "
                f"{target_s:.0f} s asked for"
            )
        if notes:
            result["note"] = "; ".join(notes)
        sidecar = {k: v for k, v in result.items() if k != "audio_path"}
        sidecar["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        (self.directory / f"{name}.json").write_text(json.dumps(sidecar), encoding="utf-8")
        return result

    def _passages(
        self, pipeline: Pipeline, collection: CollectionInfo, topic: str, minutes: int
    ) -> list[RetrievedDocument]:
        """The topic's passages, enough to fill the duration: the nearest chunks by the query's embedding."""
        store = pipeline.context.store
        vector = pipeline.context.embedder.encode_query(topic)
        wanted = min(MAX_PASSAGES, PASSAGES_PER_MINUTE * minutes + 4)
        hits = store.vector_search(collection.id, vector, wanted, None)
        chunks = store.get_chunks(collection.id, [hit.chunk_id for hit in hits])
        scores = {hit.chunk_id: hit.score for hit in hits}
        return [RetrievedDocument(chunk, scores[chunk.chunk_id]) for chunk in chunks]

    def _llm_turns(
        self, topic: str, passages: list[RetrievedDocument], citations: Citations, target_s: float
    ) -> tuple[list[Turn], str | None]:
        """The LLM's script, asked for in parts until it is long enough (or stops adding lines)."""
        given = passages[: script.LLM_PASSAGES]
        for document in given:
            citations.cite(document)
        words = round(target_s / 60 * HOST.rate)
        first, sent = script.llm_prompt(topic, given, citations.numbers, words, self.llm.context_chars)
        # Citations only to passages the LLM was sent: those past LLM_CONTEXT_CHARS were not.
        valid = {citations.numbers[d.chunk.document_id] for d in given[:sent]}
        turns: list[Turn] = []
        seen: set[str] = set()
        error: str | None = None
        for _ in range(MAX_LLM_CALLS):
            missing = words - script.word_count(turns)
            if missing <= 0.1 * words:
                break
            prompt = first if not turns else script.continuation_prompt(first, turns, missing)
            produced = self.llm.produce(
                script.LLM_SYSTEM,
                prompt,
                max_tokens=min(8192, 2 * missing + 200),
                fallback_name="extractive",
                fallback=lambda: "",
            )
            if produced.source != "llm":
                error = produced.error
                break
            more = script.parse_script(produced.text, valid, seen)
            if not more:
                if not turns:
                    error = "the LLM's reply held no HOST: or GUEST: line"
                break
            turns.extend(more)
            progress.advance(f"{script.word_count(turns)}/{words} words")
        if not turns:
            citations.numbers.clear()
        return turns, error

    def _speak(
        self, topic: str, source: str, turns: Iterator[Turn], target_s: float
    ) -> tuple[list[Turn], array.array[int], int, int]:
        """Speak the introduction, turns until the target is reached, and the closing."""
        speech = engine()
        rate = speech.sample_rate
        voices = {"host": HOST, "guest": GUEST}
        intro = script.introduction(topic, source)
        outro = script.closing(topic)
        outro_audio = speech.synthesize(outro.spoken(), HOST)
        budget = target_s - len(outro_audio) / rate - TURN_PAUSE_S
        samples = array.array("h")
        spoken: list[Turn] = []

        def elapsed() -> float:
            return len(samples) / rate

        def say(turn: Turn, *, whole: bool) -> None:
            """Speak the turn's sentences; an answer stops early once the budget is spent."""
            sentences = [s.text[:MAX_SENTENCE_CHARS] for s in split_sentences(turn.spoken())]
            turn.start_s = elapsed()
            said = 0
            for sentence in sentences:
                if said and not whole and elapsed() >= budget:
                    break
                check_cancelled()
                samples.extend(speech.synthesize(sentence, voices[turn.speaker]))
                samples.extend(silence(SENTENCE_PAUSE_S, rate))
                said += 1
            turn.end_s = elapsed()
            samples.extend(silence(TURN_PAUSE_S, rate))
            if said < len(sentences):
                turn.text = _first_sentences(turn, said)
            spoken.append(turn)

        say(intro, whole=True)
        for turn in turns:
            if elapsed() >= budget:
                break
            # A question is asked only with room left for its answer.
            question_s = 60 * len(turn.spoken().split()) / HOST.rate
            if turn.speaker == "host" and elapsed() + question_s + MIN_ANSWER_S > budget and len(spoken) > 1:
                break
            say(turn, whole=turn.speaker == "host")
            progress.advance(f"{elapsed():.0f}/{target_s:.0f} s spoken")
        outro.start_s = elapsed()
        samples.extend(outro_audio)
        outro.end_s = elapsed()
        spoken.append(outro)
        return spoken, samples, rate, sum(1 for t in spoken if t.filled)


def _first_sentences(turn: Turn, count: int) -> str:
    """The turn's text cut to its first sentences (what was spoken), its citations kept."""
    sentences = [s.text for s in split_sentences(turn.text)]
    text = " ".join(sentences[:count])
    marks = "".join(f" [{c}]" for c in turn.citations if f"[{c}]" not in text)
    return text + marks


def _chain(first: list[Turn], then: Iterator[Turn]) -> Iterator[Turn]:
    yield from first
    for turn in then:
        turn.filled = True
        yield turn


def podcast_file(data_dir: Path, name: str) -> dict[str, Any]:
    """A saved podcast's audio path, for the front end's rag://podcast/{name} resource."""
    directory = podcast_dir(data_dir)
    sidecar = directory / f"{name}.json"
    audio = directory / f"{name}.wav"
    if not _NAME.match(name) or not sidecar.is_file() or not audio.is_file():
        msg = f"no podcast {name!r}; rag_generate_podcast returns the URI of each one it makes"
        raise DocumentNotFoundError(msg)
    about = json.loads(sidecar.read_text(encoding="utf-8"))
    if not access.can_see(str(about.get("collection_id", ""))):
        msg = f"no podcast {name!r}; rag_generate_podcast returns the URI of each one it makes"
        raise DocumentNotFoundError(msg)
    return {"path": str(audio), "mime_type": MIME_TYPE, "bytes": audio.stat().st_size}
