"""Answer generators: an honest extractive answer by default, any OpenAI-compatible LLM when configured."""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from iris_rag.llm import (
    PASSAGES_ARE_DATA,
    PromptPassage,
    TechniqueLLM,
    citation_marks,
    render_passages,
    strip_unknown_citations,
)
from iris_rag.settings import Settings
from iris_rag.text import query_terms, split_sentences, stem, word_count

logger = logging.getLogger(__name__)

AnswerSource = Literal["llm", "extractive"]

NOTHING_RETRIEVED = "no passage was retrieved"


def nothing_found(reason: str = NOTHING_RETRIEVED) -> str:
    """The answer when no passage is left to answer from, saying why (Pipeline.run knows the reason)."""
    return (
        f"Nothing relevant was found in the collection for this query: {reason}, so there is no answer "
        "to give."
    )


# Below this cosine similarity between the query and its best passage (all-MiniLM-L6-v2), the extractive
# answer says nothing relevant was found instead of quoting. Chosen on the bundled SciFact sample: its
# answerable queries' best passage scored 0.276 at the 1st percentile (median 0.647), SciFact train
# questions whose paper is not in the sample still 0.248 (median 0.461: topical, so quoted), off-topic
# questions 0.154 at the median (docs/benchmarks.md, "Nothing relevant").
RELEVANCE_FLOOR = 0.25
# Under this many characters a one-word sentence is bare (a heading such as "Requirements").
BARE_SENTENCE_CHARS = 20

EXTRACTIVE_STEPS_NOTE = (
    "No LLM is configured: these steps are the evidence chain of the extractive answer (how its quoted "
    "sentences were chosen from the retrieved chunks), not reasoning by a model."
)


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
    chunk_id: str = ""

    @property
    def cited_id(self) -> str:
        """The id a reasoning step cites: the chunk's, or the document's for a passage built without one."""
        return self.chunk_id or self.document_id


def best_similarity(passages: list[Passage]) -> float | None:
    """The highest known query similarity among the passages, or None if none is known."""
    known = [p.query_similarity for p in passages if p.query_similarity is not None]
    return max(known) if known else None


@dataclass(frozen=True, slots=True)
class ReasoningStep:
    """One step from the evidence to the answer, with the chunks it rests on."""

    text: str
    chunk_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reasoning:
    """options.cot_steps: the steps, who wrote them, and what they are (an LLM's, or the extractive chain)."""

    source: AnswerSource
    note: str
    steps: tuple[ReasoningStep, ...]

    def to_dict(self) -> dict[str, Any]:
        """The wire shape (common.json#/$defs/technique_response, cot_steps)."""
        return {
            "source": self.source,
            "note": self.note,
            "steps": [
                {"step": number, "text": step.text, "chunk_ids": list(step.chunk_ids)}
                for number, step in enumerate(self.steps, start=1)
            ],
        }


@dataclass(frozen=True, slots=True)
class Generation:
    """A generated answer and what made it (and, when asked for, the steps to it)."""

    answer: str
    model: str
    source: AnswerSource
    steps: Reasoning | None = None
    # metadata.generation: what the LLM was sent and what its reply needed (empty for an extractive answer).
    report: dict[str, Any] = field(default_factory=dict)


class Generator(Protocol):
    """Writes an answer to a query from passages."""

    model_name: str

    def generate(
        self,
        query: str,
        passages: list[Passage],
        *,
        temperature: float,
        max_tokens: int,
        steps: bool = False,
        empty_reason: str = NOTHING_RETRIEVED,
    ) -> Generation:
        """Answer the query from the passages alone (steps: with the reasoning steps, each citing chunks).

        empty_reason says why, when there is no passage (no document passed the filters, say).
        """


def _terms(text: str) -> list[str]:
    return [t for t in query_terms(text) if len(t) > 1]


def _bare(sentence: str) -> bool:
    """One short word, no more: a heading or a bare reply (a long clause without spaces is not)."""
    return len(sentence) < BARE_SENTENCE_CHARS and len(sentence.split()) < 2


class ExtractiveGenerator:
    """Quotes the retrieved sentences that best match the query, each cited by its document."""

    model_name = "extractive"

    def __init__(self, max_sentences: int = 3) -> None:
        self.max_sentences = max_sentences

    def generate(
        self,
        query: str,
        passages: list[Passage],
        *,
        temperature: float,
        max_tokens: int,
        steps: bool = False,
        empty_reason: str = NOTHING_RETRIEVED,
    ) -> Generation:
        """Pick sentences by IDF-weighted overlap with the query, tie-broken by retrieval score."""
        del temperature  # nothing is sampled
        if not passages:
            chain = (
                ReasoningStep(
                    f"{empty_reason[:1].upper()}{empty_reason[1:]}, so there is no evidence to answer from.",
                    (),
                ),
            )
            return self._generation(nothing_found(empty_reason), chain if steps else None)
        best = best_similarity(passages)
        if best is not None and best < RELEVANCE_FLOOR:
            # Quoting the closest sentences would pass unrelated text off as an answer.
            closest = "; ".join(f"[{p.citation}] {p.title or p.document_id}" for p in _by_citation(passages))
            answer = (
                "Nothing relevant was found: no retrieved passage is close to this question "
                f"(best similarity {best:.2f}, below {RELEVANCE_FLOOR}), so there is no answer to quote. "
                f"The closest passages, probably unrelated: {closest}"
            )
            nearest = max(passages, key=lambda p: p.query_similarity or 0.0)
            chain = (
                ReasoningStep(
                    f"The closest chunk's similarity to the question is {best:.2f}, below the floor "
                    f"{RELEVANCE_FLOOR}: nothing retrieved is about it, so nothing is quoted.",
                    (nearest.cited_id,),
                ),
            )
            return self._generation(answer, chain if steps else None)
        candidates = [
            (passage, position, sentence.text)
            for passage in passages
            for position, sentence in enumerate(split_sentences(passage.content))
        ]
        # A lone short word ("Requirements", a heading; "Yes.") answers nothing on its own; quoted only if
        # nothing longer was retrieved.
        longer = [c for c in candidates if not _bare(c[2])]
        candidates = longer or candidates
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
        quoted: set[str] = set()
        words = 0
        for i in ranked:
            # The same sentence comes twice from two overlapping chunks (CHUNK_OVERLAP) or two copies of a
            # document: quoted once, where it scored best.
            said = " ".join(candidates[i][2].split()).casefold()
            if said in quoted:
                continue
            length = word_count(candidates[i][2])
            if chosen and (len(chosen) >= self.max_sentences or words + length > max_tokens):
                break
            chosen.append(i)
            quoted.add(said)
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
        if not steps:
            return self._generation(answer, None)
        # The evidence chain: what was searched, why each quoted sentence was picked, how the answer is made.
        chunk_ids = tuple(dict.fromkeys(p.cited_id for p in passages))
        evidence = [
            ReasoningStep(
                f"Split the {len(chunk_ids)} retrieved chunks into {total} sentences and scored each by the "
                "question's terms it contains (rarer terms count more) plus half its chunk's retrieval "
                "score.",
                chunk_ids,
            )
        ]
        query_words = {stem(t): t for t in _terms(query)}
        for i in chosen:
            passage, _, text = candidates[i]
            shared = [word for key, word in query_words.items() if key in sentence_stems[i]]
            reason = (
                f"shares {', '.join(shared)} with the question"
                if shared
                else "shares no term; picked by score"
            )
            evidence.append(
                ReasoningStep(
                    f'[{passage.citation}] "{_clip(text)}" {reason} (score {score(i):.2f}).',
                    (passage.cited_id,),
                )
            )
        evidence.append(
            ReasoningStep(
                f"The answer quotes {_sentences(len(chosen))}, in document order; nothing is inferred "
                "beyond what they say.",
                tuple(dict.fromkeys(candidates[i][0].cited_id for i in chosen)),
            )
        )
        return self._generation(answer, tuple(evidence))

    def _generation(self, answer: str, chain: tuple[ReasoningStep, ...] | None) -> Generation:
        reasoning = Reasoning("extractive", EXTRACTIVE_STEPS_NOTE, chain) if chain is not None else None
        return Generation(answer, self.model_name, "extractive", reasoning)


def _sentences(count: int) -> str:
    return f"{count} sentence{'' if count == 1 else 's'}"


def _clip(text: str, limit: int = 160) -> str:
    """A sentence cut to about limit characters at a word boundary, for a step's text."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


def _by_citation(passages: list[Passage]) -> list[Passage]:
    """The first passage of each cited document, in citation order."""
    first: dict[int, Passage] = {}
    for passage in passages:
        first.setdefault(passage.citation, passage)
    return [first[c] for c in sorted(first)]


SYSTEM_PROMPT = (
    "You answer questions using only the numbered context passages you are given. "
    "Cite the passages you use as [n], n being the passage's id. If the context does not contain the answer, "
    "say that you do not know rather than guessing. Be concise. " + PASSAGES_ARE_DATA
)
STEPS_PROMPT = (
    " After the answer, write a line 'Steps:' and then the reasoning from the context to the answer, one "
    "numbered step a line, each ending with the chunk ids (each passage's chunk attribute) of the passages "
    "it uses in braces, as {id1, id2}."
)
LLM_STEPS_NOTE = (
    "The LLM's own steps from the passages to its answer; a step lists only chunk ids it was given."
)
LLM_NO_STEPS_NOTE = (
    "The LLM was asked for steps but wrote no 'Steps:' section; its reply is the answer as is."
)


class OpenAIGenerator:
    """Chat completion against any OpenAI-compatible server (LLM_BASE_URL)."""

    def __init__(self, settings: Settings) -> None:
        self.model_name = settings.llm_model
        self._llm = TechniqueLLM(settings)

    def generate(
        self,
        query: str,
        passages: list[Passage],
        *,
        temperature: float,
        max_tokens: int,
        steps: bool = False,
        empty_reason: str = NOTHING_RETRIEVED,
    ) -> Generation:
        """Ask the LLM, with the passages as numbered context (and their chunk ids when steps are wanted).

        The passages go up to LLM_CONTEXT_CHARS; the answer keeps only citations to passages sent, and
        metadata.generation says what was sent and removed, and whether the reply was cut short.
        """
        rendered = render_passages(
            (PromptPassage(p.citation, p.title, p.content, p.cited_id if steps else None) for p in passages),
            self._llm.context_chars,
        )
        user = f"Context:\n{rendered.text or f'(none: {empty_reason})'}\n\nQuestion: {query}"
        system = SYSTEM_PROMPT + (STEPS_PROMPT if steps else "")
        reply = self._llm.chat(
            system, user, max_tokens=max_tokens, temperature=temperature, remedy="; raise options.max_tokens"
        )
        sent = passages[: rendered.sent]
        answer, reasoning = parse_llm_steps(reply.text, sent) if steps else (reply.text, None)
        answer, removed = strip_unknown_citations(answer, {p.citation for p in sent})
        report: dict[str, Any] = {
            "passages_sent": len(sent),
            "passages_retrieved": len(passages),
            "finish_reason": reply.finish_reason,
            "answer_truncated": reply.truncated,
            "removed_citations": removed,
        }
        if reply.capped_at_chars is not None:
            report["reply_capped_at_chars"] = reply.capped_at_chars
        return Generation(answer.strip() or reply.text, self.model_name, "llm", reasoning, report)


# The steps section of an LLM's reply: a line "Steps:" (markdown emphasis allowed), then one step a line.
_STEPS_HEADING = re.compile(r"^[ \t*#_]*(?:reasoning )?steps[ \t*_]*:[ \t*_]*$", re.IGNORECASE | re.MULTILINE)
_STEP_NUMBER = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s*")
_CHUNK_IDS = re.compile(r"\{([^{}]*)\}")


def parse_llm_steps(text: str, passages: list[Passage]) -> tuple[str, Reasoning]:
    """Split an LLM reply into its answer and its steps; a step keeps only the ids of chunks it was given."""
    headings = list(_STEPS_HEADING.finditer(text))
    if not headings:
        return text, Reasoning("llm", LLM_NO_STEPS_NOTE, ())
    heading = headings[-1]
    answer = text[: heading.start()].strip()
    known = {p.cited_id for p in passages}
    by_citation: dict[int, list[str]] = {}
    for passage in passages:
        by_citation.setdefault(passage.citation, []).append(passage.cited_id)
    found: list[ReasoningStep] = []
    for line in text[heading.end() :].splitlines():
        body = _STEP_NUMBER.sub("", line).strip()
        if not body:
            continue
        named = [i.strip() for group in _CHUNK_IDS.findall(body) for i in group.split(",")]
        cited = [i for n in citation_marks(body).kept for i in by_citation.get(n, [])]
        chunk_ids = tuple(dict.fromkeys(i for i in [*named, *cited] if i in known))
        found.append(ReasoningStep(_CHUNK_IDS.sub("", body).strip(), chunk_ids))
    return answer or text, Reasoning("llm", LLM_STEPS_NOTE, tuple(found))


def create_generator(settings: Settings) -> Generator:
    """The generator LLM_PROVIDER selects."""
    if settings.llm_provider == "openai":
        return OpenAIGenerator(settings)
    return ExtractiveGenerator()
