"""The podcast's script: an LLM's dialogue when one is configured, otherwise an extractive one (labelled).

The extractive script is a conversation over the retrieved passages, best first: for each passage the host
asks a question built from its key sentence (the patterns of iris_rag.questions) and the guest answers by
quoting the passage's sentences, cited [n]. It is produced lazily, one exchange at a time, so the speaker
stops when the requested duration is reached rather than at a word count guessed in advance.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from iris_rag.llm import (
    CITATION_CAP,
    PASSAGES_ARE_DATA,
    PromptPassage,
    citation_marks,
    render_passages,
    strip_unknown_citations,
)
from iris_rag.pipeline import RetrievedDocument
from iris_rag.questions import PhraseStatistics, key_phrase, pattern_question
from iris_rag.text import split_sentences

Speaker = Literal["host", "guest"]
# Sentences the guest quotes from one passage.
ANSWER_SENTENCES = 3
# Passages given to the LLM, and characters of each.
LLM_PASSAGES = 24
LLM_PASSAGE_CHARS = 1200

_MARKUP = re.compile(r"[*_#`>]+")


@dataclass(slots=True)
class Turn:
    """One speaker's turn: the text (citations as [n]) and the sources it cites."""

    speaker: Speaker
    text: str
    citations: list[int] = field(default_factory=list)
    # An extractive exchange that makes up for an LLM script shorter than asked.
    filled: bool = False
    # Where the turn is in the audio, in seconds (set as it is spoken).
    start_s: float = 0.0
    end_s: float = 0.0

    def spoken(self) -> str:
        """The words read aloud: citation marks and markup are for the transcript only."""
        # An extractive script numbers up to 150 documents: past CITATION_CAP, its own numbers are marks too.
        marks = citation_marks(self.text, lambda _: False, max(CITATION_CAP, *self.citations, 0))
        return " ".join(_MARKUP.sub("", marks.text).split())


class Citations:
    """Citation numbers by document, in the order the script first cites them."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}
        self.titles: dict[str, str] = {}
        self.chunks: dict[str, list[str]] = {}

    def cite(self, document: RetrievedDocument) -> int:
        """The document's number (a new one the first time it is cited)."""
        chunk = document.chunk
        number = self.numbers.setdefault(chunk.document_id, len(self.numbers) + 1)
        self.titles.setdefault(chunk.document_id, chunk.title)
        chunks = self.chunks.setdefault(chunk.document_id, [])
        if chunk.chunk_id not in chunks:
            chunks.append(chunk.chunk_id)
        return number

    def sources(self, cited: set[int]) -> list[dict[str, object]]:
        """The cited documents, by number."""
        return [
            {"citation": n, "document_id": d, "title": self.titles[d], "chunk_ids": self.chunks[d]}
            for d, n in self.numbers.items()
            if n in cited
        ]


def introduction(topic: str, source: str) -> Turn:
    """The host's opening, which says how the script was written."""
    how = (
        "Every answer in this episode is quoted from the documents; no language model wrote it."
        if source == "extractive"
        else "The script was written by a language model from the documents, which it cites."
    )
    return Turn("host", f"Welcome. Today's topic is {topic.strip().rstrip('.?!')}. {how}")


def closing(topic: str) -> Turn:
    """The host's last words."""
    return Turn("host", f"That is all for today on {topic.strip().rstrip('.?!')}. Thank you for listening.")


def extractive_exchanges(passages: list[RetrievedDocument], citations: Citations) -> Iterator[Turn]:
    """Host question, guest quotation, for each passage in order; passages without a sentence are skipped."""
    statistics = PhraseStatistics.of(d.chunk.content for d in passages)
    for document in passages:
        sentences = [s.text for s in split_sentences(document.chunk.content) if len(s.text.split()) >= 4]
        if not sentences:
            continue
        question = None
        start = 0
        for position, sentence in enumerate(sentences):
            question = pattern_question(sentence)
            if question is not None:
                start = position
                break
        if question is None:
            phrase = key_phrase(sentences[0], statistics)
            title = document.chunk.title.strip().rstrip(".")
            question = (
                f"What is known about {phrase}?" if phrase else f"What does the document {title!r} tell us?"
            )
        number = citations.cite(document)
        yield Turn("host", question[0].upper() + question[1:])
        quoted = " ".join(sentences[start : start + ANSWER_SENTENCES])
        yield Turn("guest", f"{quoted} [{number}]", [number])


# LLM path

LLM_SYSTEM = (
    "You write the script of a two-voice podcast, grounded only in the numbered passages you are given. "
    "Every line starts with 'HOST:' or 'GUEST:'. The host asks and links topics; the guest explains, citing "
    "the passages used as [n] after each claim, n being the passage's id. Say nothing the passages do not "
    "support. No stage directions, no headings, no sound effects. " + PASSAGES_ARE_DATA
)

_LINE = re.compile(r"^\W*(?P<speaker>host|guest)\W*:\W*(?P<text>.+)$", re.IGNORECASE)


def llm_prompt(
    topic: str,
    passages: list[RetrievedDocument],
    citations: dict[str, int],
    words: int,
    budget: int | None = None,
) -> tuple[str, int]:
    """The first request (topic, length in words, passages numbered by document); how many passages it holds.

    budget: the passages' characters (LLM_CONTEXT_CHARS); those past it are left out.
    """
    numbered = render_passages(
        (
            PromptPassage(citations[d.chunk.document_id], d.chunk.title, d.chunk.content[:LLM_PASSAGE_CHARS])
            for d in passages
        ),
        budget,
    )
    return f"Topic: {topic}\nLength: about {words} words.\n\nPassages:\n{numbered.text}", numbered.sent


def continuation_prompt(first_prompt: str, turns: list[Turn], words: int) -> str:
    """A later request: the same passages, the script's last lines, and how many more words."""
    tail = "\n".join(f"{t.speaker.upper()}: {t.text}" for t in turns[-6:])
    return (
        f"{first_prompt}\n\nThe script so far ends:\n{tail}\n\nContinue it for about {words} more words, "
        "without repeating anything already said."
    )


def parse_script(text: str, valid: set[int], seen: set[str]) -> list[Turn]:
    """The reply's HOST:/GUEST: lines as turns; lines seen are skipped.

    A citation to no passage sent ([9] of four) comes out of the text as out of the turn's citations: the
    transcript cites only what `sources` lists.
    """
    turns = []
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match is None:
            continue
        body = " ".join(strip_unknown_citations(match["text"], valid)[0].split())
        key = body.lower()
        if not body or key in seen:
            continue
        seen.add(key)
        cited = sorted(set(citation_marks(body, valid.__contains__).kept))
        speaker: Speaker = "host" if match["speaker"].lower() == "host" else "guest"
        turns.append(Turn(speaker, body, cited))
    return turns


def word_count(turns: list[Turn]) -> int:
    """Spoken words in the turns."""
    return sum(len(t.spoken().split()) for t in turns)
