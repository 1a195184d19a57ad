"""Answer generators: an honest extractive answer by default, any OpenAI-compatible LLM when configured."""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Literal, Protocol

from iris_rag.errors import GenerationFailedError, LlmServiceUnavailableError
from iris_rag.llm import openai_client
from iris_rag.redaction import redact
from iris_rag.settings import Settings
from iris_rag.text import query_terms, split_sentences, stem

logger = logging.getLogger(__name__)

AnswerSource = Literal["llm", "extractive"]

NOTHING_FOUND = (
    "Nothing relevant was found in the collection for this query: no retrieved passage passed the "
    "similarity threshold, so there is no answer to give."
)

# Below this cosine similarity between the query and its best passage (all-MiniLM-L6-v2), the extractive
# answer says nothing relevant was found instead of quoting. Chosen on the bundled SciFact sample: its
# answerable queries' best passage scored 0.276 at the 1st percentile (median 0.647), SciFact train
# questions whose paper is not in the sample still 0.248 (median 0.461: topical, so quoted), off-topic
# questions 0.154 at the median (docs/benchmarks.md, "Nothing relevant").
RELEVANCE_FLOOR = 0.25


@dataclass(frozen=True, slots=True)
class Passage:
    """A retrieved text given to a generator, with the citation number of its document."""

    citation: int
    document_id: str
    title: str
    content: str
    score: float
    # Cosine similarity of the query and this passage (any technique's score scale aside); None if unknown.
    query_similarity: float | None = None


def best_similarity(passages: list[Passage]) -> float | None:
    """The highest known query similarity among the passages, or None if none is known."""
    known = [p.query_similarity for p in passages if p.query_similarity is not None]
    return max(known) if known else None


@dataclass(frozen=True, slots=True)
class Generation:
    """A generated answer and what made it."""

    answer: str
    model: str
    source: AnswerSource


class Generator(Protocol):
    """Writes an answer to a query from passages."""

    model_name: str

    def generate(
        self, query: str, passages: list[Passage], *, temperature: float, max_tokens: int
    ) -> Generation:
        """Answer the query from the passages alone."""


def _terms(text: str) -> list[str]:
    return [t for t in query_terms(text) if len(t) > 1]


class ExtractiveGenerator:
    """Quotes the retrieved sentences that best match the query, each cited by its document."""

    model_name = "extractive"

    def __init__(self, max_sentences: int = 3) -> None:
        self.max_sentences = max_sentences

    def generate(
        self, query: str, passages: list[Passage], *, temperature: float, max_tokens: int
    ) -> Generation:
        """Pick sentences by IDF-weighted overlap with the query, tie-broken by retrieval score."""
        del temperature  # nothing is sampled
        if not passages:
            return Generation(NOTHING_FOUND, self.model_name, "extractive")
        best = best_similarity(passages)
        if best is not None and best < RELEVANCE_FLOOR:
            # Quoting the closest sentences would pass unrelated text off as an answer.
            closest = "; ".join(f"[{p.citation}] {p.title or p.document_id}" for p in _by_citation(passages))
            answer = (
                "Nothing relevant was found: no passage in the collection is close to this question "
                f"(best similarity {best:.2f}, below {RELEVANCE_FLOOR}), so there is no answer to quote. "
                f"The closest passages, probably unrelated: {closest}"
            )
            return Generation(answer, self.model_name, "extractive")
        candidates = [
            (passage, position, sentence.text)
            for passage in passages
            for position, sentence in enumerate(split_sentences(passage.content))
        ]
        query_stems = {stem(t) for t in _terms(query)}
        sentence_stems = [{stem(t) for t in _terms(text)} for _, _, text in candidates]
        frequency = Counter(stem for stems in sentence_stems for stem in stems)
        total = len(candidates)

        def score(i: int) -> float:
            overlap = query_stems & sentence_stems[i]
            lexical = sum(math.log(1 + total / frequency[stem]) for stem in overlap)
            return lexical + 0.5 * candidates[i][0].score

        ranked = sorted(range(total), key=score, reverse=True)
        chosen: list[int] = []
        words = 0
        for i in ranked:
            length = len(candidates[i][2].split())
            if chosen and (len(chosen) >= self.max_sentences or words + length > max_tokens):
                break
            chosen.append(i)
            words += length
        # Read in document order, as the passages came.
        chosen.sort(key=lambda i: (candidates[i][0].citation, i))
        lines = [f"- {candidates[i][2]} [{candidates[i][0].citation}]" for i in chosen]
        cited = sorted({candidates[i][0].citation for i in chosen})
        titles = {p.citation: p.title or p.document_id for p in passages}
        sources = "; ".join(f"[{c}] {titles[c]}" for c in cited)
        answer = (
            "Extractive answer (no LLM configured; these sentences are quoted from the retrieved documents, "
            "not generated):\n" + "\n".join(lines) + f"\n\nSources: {sources}"
        )
        return Generation(answer, self.model_name, "extractive")


def _by_citation(passages: list[Passage]) -> list[Passage]:
    """The first passage of each cited document, in citation order."""
    first: dict[int, Passage] = {}
    for passage in passages:
        first.setdefault(passage.citation, passage)
    return [first[c] for c in sorted(first)]


SYSTEM_PROMPT = (
    "You answer questions using only the numbered context passages you are given. "
    "Cite the passages you use as [n]. If the context does not contain the answer, say that you do not know "
    "rather than guessing. Be concise."
)


class OpenAIGenerator:
    """Chat completion against any OpenAI-compatible server (LLM_BASE_URL)."""

    def __init__(self, settings: Settings) -> None:
        self.model_name = settings.llm_model
        self._secrets = settings.llm_secrets
        self._client = openai_client(settings)

    def generate(
        self, query: str, passages: list[Passage], *, temperature: float, max_tokens: int
    ) -> Generation:
        """Ask the LLM, with the passages as numbered context."""
        context = "\n\n".join(f"[{p.citation}] {p.title}\n{p.content}".strip() for p in passages)
        user = f"Context:\n{context or '(no passages were retrieved)'}\n\nQuestion: {query}"
        try:
            completion = self._client.chat.completions.create(
                model=self.model_name,
                messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}],
                temperature=temperature,
                max_tokens=max_tokens,
            )
        except Exception as exc:
            from openai import APIConnectionError  # its subclass APITimeoutError too

            # Unreachable (refused, unknown host, timed out after LLM_MAX_RETRIES) is the spec's own code.
            unreachable = isinstance(exc, APIConnectionError)
            error = LlmServiceUnavailableError if unreachable else GenerationFailedError
            what = "cannot be reached" if unreachable else "failed"
            msg = f"the LLM at {self._client.base_url} {what}: {type(exc).__name__}: {exc}"
            raise error(redact(msg, self._secrets)) from exc
        if not completion.choices or completion.choices[0].message.content is None:
            msg = "the LLM returned no answer text"
            raise GenerationFailedError(msg)
        return Generation(completion.choices[0].message.content.strip(), self.model_name, "llm")


def create_generator(settings: Settings) -> Generator:
    """The generator LLM_PROVIDER selects."""
    if settings.llm_provider == "openai":
        return OpenAIGenerator(settings)
    return ExtractiveGenerator()
