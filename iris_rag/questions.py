"""rag_smart_questions: follow-up questions the collection can answer, each checked to retrieve its source.

The passages the context retrieves are the material. With an LLM configured, it writes the questions and
names the passage each comes from; without one (or when it fails), questions are built from the passages'
key sentences by fixed patterns (labelled "extractive"). Either way every candidate is run through the same
retrieval, and only those whose source chunk comes back in the top VERIFY_TOP_K are returned.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from iris_rag.cancellation import check_cancelled
from iris_rag.errors import PipelineNotFoundError
from iris_rag.llm import PASSAGES_ARE_DATA, PromptPassage, TechniqueLLM, render_passages, strip_label
from iris_rag.pipeline import Pipeline, QueryOptions, RetrievedDocument
from iris_rag.stores.base import CollectionInfo
from iris_rag.text import STOPWORDS, query_terms, split_sentences, stem

# A question counts as answerable when retrieving it brings its source chunk back this high.
VERIFY_TOP_K = 5
# Retrievers preferred for the material and the check: the best-ranking first; rag_hyde last (with an LLM it
# makes a call per question), rag_sqlrag never (it reads tables, not passages).
RETRIEVER_PREFERENCE = ("hybrid_ifind", "basic", "colbert", "noderag", "graphrag", "crag", "hyde")
EXTRACTIVE_METHOD = (
    "extractive (no LLM): each question is built by a fixed pattern from a key sentence of a retrieved "
    "passage (effect, association, definition or cause wording, else the sentence's key phrase), and kept "
    f"only if it retrieves that passage in the top {VERIFY_TOP_K}"
)
LLM_METHOD = (
    "llm: written by the LLM from the retrieved passages, each kept only if it retrieves its passage in "
    f"the top {VERIFY_TOP_K}"
)
EVIDENCE_CHARS = 300


class SmartQuestionsRequest(BaseModel):
    """rag_smart_questions' arguments (schema: schemas/tools/rag_smart_questions.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context: str = Field(min_length=1, max_length=4000)
    collection_id: str | None = None
    count: int = Field(5, ge=1, le=10)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A question and the chunk it should be answered from."""

    question: str
    chunk_id: str
    document_id: str
    evidence: str


def choose_retriever(pipelines: Mapping[str, Pipeline]) -> Pipeline:
    """The served technique that retrieves the material and checks the questions."""
    for name in RETRIEVER_PREFERENCE:
        if name in pipelines:
            return pipelines[name]
    msg = (
        "this tool needs a passage-retrieving technique (one of "
        f"{', '.join(RETRIEVER_PREFERENCE)}) in RAG_TECHNIQUES; served: {', '.join(sorted(pipelines))}"
    )
    raise PipelineNotFoundError(msg, {"available": sorted(pipelines)})


def retrieve(
    pipeline: Pipeline, query: str, collection: CollectionInfo, top_k: int
) -> list[RetrievedDocument]:
    """The technique's top chunks for a query, best first."""
    check_cancelled()
    options = QueryOptions(top_k=top_k, generate=False)
    return pipeline.retrieve(query, collection, options, pipeline.params_model()).documents[:top_k]


class SmartQuestions:
    """Writes and checks follow-up questions for a collection."""

    def __init__(self, pipelines: Mapping[str, Pipeline], llm: TechniqueLLM) -> None:
        self.pipelines = pipelines
        self.llm = llm

    def run(self, request: SmartQuestionsRequest) -> dict[str, Any]:
        """Retrieve the material, write candidates (LLM or extractive), keep those retrieving their source."""
        pipeline = choose_retriever(self.pipelines)
        collection = pipeline.resolve_collection(request.collection_id)
        passages = retrieve(pipeline, request.context, collection, min(50, 2 * request.count + 6))
        wanted = 3 * request.count  # spare candidates: some fail the check
        llm_error: str | None = None
        method = "extractive"
        candidates: list[Candidate] = []
        if self.llm.available and passages:
            prompt, sent = _llm_prompt(request.context, passages, wanted, self.llm.context_chars)
            produced = self.llm.produce(
                LLM_SYSTEM, prompt, max_tokens=60 * wanted, fallback_name="extractive", fallback=lambda: ""
            )
            if produced.source == "llm":
                candidates = parse_llm_questions(produced.text, passages[:sent])
                method = "llm"
                if not candidates:
                    llm_error = "the LLM's reply held no question citing a passage as [n]"
            else:
                llm_error = produced.error
        if not candidates:
            method = "extractive"
            candidates = extractive_questions(request.context, passages, wanted)
        kept: list[dict[str, Any]] = []
        checked = 0
        for candidate in candidates:
            if len(kept) == request.count:
                break
            checked += 1
            found = retrieve(pipeline, candidate.question, collection, VERIFY_TOP_K)
            ids = [d.chunk.chunk_id for d in found]
            if candidate.chunk_id not in ids:
                continue
            kept.append(
                {
                    "question": candidate.question,
                    "chunk_ids": [candidate.chunk_id],
                    "document_id": candidate.document_id,
                    "retrieval_rank": ids.index(candidate.chunk_id) + 1,
                    "evidence": _cut(candidate.evidence, EVIDENCE_CHARS),
                }
            )
        return {
            "collection_id": collection.id,
            "method": method,
            "method_note": LLM_METHOD if method == "llm" else EXTRACTIVE_METHOD,
            "retriever": pipeline.technique,
            "verify_top_k": VERIFY_TOP_K,
            "questions": kept,
            "candidates_checked": checked,
            "candidates_rejected": checked - len(kept),
            **({"llm_error": llm_error} if llm_error else {}),
        }


# LLM path

LLM_SYSTEM = (
    "You suggest follow-up questions a reader could ask next. Each question must be answerable from one of "
    "the numbered passages alone and must not repeat the context. Write one question per line, ending with "
    "the id of its passage in brackets, e.g. 'How does X affect Y? [2]'. No other text. " + PASSAGES_ARE_DATA
)

_LLM_LINE = re.compile(
    r"^\s*(?:\d+[.)]\s*|[-*\u2022]\s*)?(?P<question>.+?\?)[\s\"'\u201d]*\[(?P<number>\d{1,4})\]"
)


def _llm_prompt(context: str, passages: list[RetrievedDocument], wanted: int, budget: int) -> tuple[str, int]:
    """The prompt, with the passages that fit budget characters (LLM_CONTEXT_CHARS), and how many it holds."""
    numbered = render_passages(
        (PromptPassage(n, d.chunk.title, d.chunk.content) for n, d in enumerate(passages, start=1)), budget
    )
    return f"Context:\n{context}\n\nPassages:\n{numbered.text}\n\nWrite {wanted} questions.", numbered.sent


def parse_llm_questions(text: str, passages: list[RetrievedDocument]) -> list[Candidate]:
    """The questions of an LLM reply that cite a passage that exists, in order, without repeats."""
    seen: set[str] = set()
    candidates = []
    for line in text.splitlines():
        match = _LLM_LINE.match(line)
        if match is None:
            continue
        number = int(match["number"])
        question = strip_label(match["question"]).strip()
        if not question.endswith("?"):
            question += "?"
        if not 1 <= number <= len(passages) or question.lower() in seen or len(question) < 8:
            continue
        seen.add(question.lower())
        chunk = passages[number - 1].chunk
        candidates.append(Candidate(question, chunk.chunk_id, chunk.document_id, chunk.content))
    return candidates


# Extractive path

_EFFECT_VERBS = (
    r"increase[sd]?|reduce[sd]?|decrease[sd]?|improve[sd]?|inhibit(?:s|ed)?|promote[sd]?|enhance[sd]?|"
    r"impair(?:s|ed)?|prevent(?:s|ed)?|suppress(?:es|ed)?|lower(?:s|ed)?|raise[sd]?|activate[sd]?|"
    r"block(?:s|ed)?|regulate[sd]?|affect(?:s|ed)?|protect(?:s|ed)? against|attenuate[sd]?|modulate[sd]?"
)
_CAUSE_VERBS = r"cause[sd]?|induce[sd]?|trigger(?:s|ed)?|contribute[sd]? to|lead(?:s)? to|led to|drive[sn]?"
_EFFECT = re.compile(rf"\b(?:{_EFFECT_VERBS})\b", re.IGNORECASE)
_CAUSE_VERB = re.compile(rf"\b(?:{_CAUSE_VERBS})\b", re.IGNORECASE)
_RELATION = re.compile(
    r"\b(?:is|are|was|were)\s+(?:(?:not|strongly|significantly|positively|negatively|inversely|closely)\s+)*"
    r"(?:associated|correlated|linked|related)\s+(?:with|to)\b",
    re.IGNORECASE,
)
_DEFINITION = re.compile(
    r"^(?P<subject>[^,;:()]{3,60}?)\s+(?P<verb>is|are)\s+(?:a|an|one of the)\s+", re.IGNORECASE
)
_BECAUSE = re.compile(r"\s+(?:because(?: of)?|due to|as a result of)\s+", re.IGNORECASE)
# Where a subject starts (after the last of these) and where an object ends (at the first).
_SUBJECT_START = re.compile(r"\bthat\b|\bwhether\b|[,;:()]", re.IGNORECASE)
_OBJECT_END = re.compile(
    r"[,;:()]|\s(?:and|but|whereas|while|which|who|by|through|via|compared|than|when|because|due|as|"
    r"although|if|from|after|before|during|without)\s",
    re.IGNORECASE,
)
# Words that end a subject without belonging to it ("aspirin may also" reduces ...).
_TRAILING = frozenset(
    "may might can could will would also significantly markedly strongly further did does do not both "
    "directly partially substantially greatly dramatically only to which that it".split()
)
_PRONOUNS = frozenset(
    "it this these those they we he she its their our which there such where when who whom whose".split()
)
# Words that are never a key phrase: prepositions, connectives and the verbs abstracts use most.
_FUNCTION = frozenset(
    "during after before between among within without across through upon via per about against under over "
    "using used use uses remain remains remained held given show shows showed shown suggest suggests "
    "suggested indicate indicates found find finds including include includes based however although thus "
    "therefore must whether well often here each either neither another other others many much more most "
    "less least several various new recent novel whereas despite".split()
)
_PARENTHESES = re.compile(r"\s*\([^()]*\)")
_GENERIC = frozenset(
    "result results finding findings study studies effect effects aim goal purpose data method methods "
    "conclusion conclusions objective background analysis outcome outcomes evidence work paper trial".split()
)
_WORD = re.compile(r"[\w'-]+", re.UNICODE)
_QUOTES = "\"'\u201c\u201d\u2018\u2019`"
_AUXILIARIES = frozenset("is are was were be been being has have had".split())
_SUBORDINATORS = frozenset(
    "although though while whereas because since if unless when once however moreover furthermore thus "
    "therefore also here finally first second".split()
)
_PREPOSITIONS = frozenset("in on at of for with by to from into than as".split())
_SECTIONS = frozenset(
    "objective objectives background methods method results conclusion conclusions purpose aims aim "
    "introduction design setting participants findings interpretation context importance highlights".split()
)
MAX_PHRASE_WORDS = 10
MAX_SUBJECT_WORDS = 7


def _cut(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rsplit(" ", 1)[0] + " \u2026"


def _content_stems(text: str) -> set[str]:
    return {stem(t) for t in query_terms(text) if len(t) > 1}


def _tidy(phrase: str, *, subject: bool) -> str | None:
    """A subject or object phrase fit to quote in a question, or None.

    A phrase holding a verb is a clause, not a noun phrase ("mice showed", "is frequently"), and would make
    a garbled question: an auxiliary anywhere, or an -ed word after the first, rejects it; so do a subject
    ending in "and" (a coordinated verb phrase), an object starting with a preposition, and abstract section
    labels ("OBJECTIVE").
    """
    words = [w.strip(_QUOTES) for w in phrase.strip(" .,;:").split()]
    words = [w for w in words if w]
    while words and (words[0].lower() in _SECTIONS or words[0].lower() in _SUBORDINATORS):
        words.pop(0)
    if subject:
        if words and words[-1].lower() in {"and", "or"}:
            return None
        while words and words[-1].lower() in _TRAILING:
            words.pop()
    elif words and words[0].lower() in _PREPOSITIONS:
        return None
    while words and words[-1].lower() in STOPWORDS:
        words.pop()
    limit = MAX_SUBJECT_WORDS if subject else MAX_PHRASE_WORDS
    if not words or len(words) > limit:
        return None
    lowered = [w.lower() for w in words]
    if (
        any(w in _AUXILIARIES or w in _PRONOUNS for w in lowered)
        or any(w.endswith("ed") and w.isalpha() for w in lowered[1:])
        or (subject and any(w in {"a", "an"} for w in lowered[1:]))
        or (subject and all(w.endswith(("ed", "ing")) for w in lowered if w not in STOPWORDS))
    ):
        return None
    content = [w for w in lowered if w not in STOPWORDS]
    if not content or all(w.strip("'") in _GENERIC for w in content):
        return None
    first = words[0]
    # A sentence's capital is not the phrase's: "Daily aspirin" inside a question is "daily aspirin".
    if first[:1].isupper() and first[1:].islower():
        words[0] = first.lower()
    return " ".join(words)


def _subject_before(text: str) -> str | None:
    return _tidy(_SUBJECT_START.split(text)[-1], subject=True)


def _object_after(text: str) -> str | None:
    return _tidy(_OBJECT_END.split(" " + text, maxsplit=1)[0], subject=False)


def pattern_question(sentence: str) -> str | None:
    """A question from the sentence's wording (effect, cause, association, definition, reason), or None."""
    text = _PARENTHESES.sub("", sentence).rstrip(" .!")
    if text.endswith("?"):
        return None
    for pattern, template in (
        (_RELATION, "What is the relationship between {s} and {o}?"),
        (_EFFECT, "What is the effect of {s} on {o}?"),
        (_CAUSE_VERB, "What is the link between {s} and {o}?"),
    ):
        for match in pattern.finditer(text):
            before = text[: match.start()].split()
            if before and before[-1].lower().endswith("ly") and match[0].lower().endswith("ed"):
                continue  # "a thermally induced change": an adjective, not the sentence's verb
            subject = _subject_before(text[: match.start()])
            target = _object_after(text[match.end() :])
            if subject and target:
                return template.format(s=subject, o=target)
    because = _BECAUSE.search(text)
    if because is not None:
        clause = _tidy(_SUBJECT_START.split(text[: because.start()])[-1], subject=False)
        if clause and len(clause.split()) >= 3:
            return f"What explains why {clause}?"
    definition = _DEFINITION.match(text)
    if definition is not None:
        subject = _tidy(definition["subject"], subject=True)
        if subject and len(subject.split()) <= 6:
            return f"What {definition['verb'].lower()} {subject}?"
    return None


@dataclass(frozen=True, slots=True)
class PhraseStatistics:
    """Over some passages: each stem's IDF by sentence, and the word pairs and triples said twice or more."""

    idf: dict[str, float]
    recurring: frozenset[str]

    @classmethod
    def of(cls, texts: Iterable[str]) -> PhraseStatistics:
        """Count the sentences of these texts."""
        sentences = [s.text for text in texts for s in split_sentences(text)]
        frequency = Counter(st for text in sentences for st in _content_stems(text))
        total = max(len(sentences), 1)
        grams: Counter[str] = Counter()
        for text in sentences:
            for run in _runs(text):
                lowered = [w.lower() for w in run]
                grams.update(
                    {" ".join(lowered[i : i + n]) for n in (2, 3) for i in range(len(lowered) - n + 1)}
                )
        return cls(
            {st: math.log(1 + total / n) for st, n in frequency.items()},
            frozenset(g for g, n in grams.items() if n >= 2),
        )


def _runs(sentence: str) -> list[list[str]]:
    """The sentence's runs of content words (no stopword, verb-like or function word inside)."""
    runs: list[list[str]] = [[]]
    for position, word in enumerate(_WORD.findall(sentence)):
        lower = word.lower()
        verbish = _EFFECT.fullmatch(lower) or _CAUSE_VERB.fullmatch(lower) or lower.endswith("ly")
        if (
            lower in STOPWORDS
            or lower in _TRAILING
            or lower in _FUNCTION
            or lower in _SECTIONS
            or verbish
            or len(word) < 3
            or word.isdigit()
        ):
            runs.append([])
            continue
        runs[-1].append(lower if position == 0 and word[1:].islower() else word)
    return [run for run in runs if run]


def key_phrase(sentence: str, statistics: PhraseStatistics) -> str | None:
    """The sentence's most informative term: a word pair or triple the passages repeat, else one word.

    Repeated word sequences are how a corpus names its subjects ("vitamin D", "bone loss"); a single
    word is the fallback, weighted up when it looks like a name (an abbreviation, a gene).
    """
    best: tuple[float, str] | None = None
    for run in _runs(sentence):
        for n in (1, 2, 3):
            for i in range(len(run) - n + 1):
                words = run[i : i + n]
                if n > 1 and " ".join(w.lower() for w in words) not in statistics.recurring:
                    continue
                if all(w.lower() in _GENERIC for w in words):
                    continue
                score = sum(statistics.idf.get(stem(w.lower()), 0.0) for w in words) * (2.0 if n > 1 else 1.0)
                if any(any(c.isupper() for c in w[1:]) or any(c.isdigit() for c in w) for w in words):
                    score *= 1.5  # an abbreviation or a gene-like name: what a reader asks about
                if best is None or score > best[0]:
                    best = (score, " ".join(words))
    if best is None:
        return None
    words = best[1].split()
    # A participle ends no term: "abnormal PrP indicating" is "abnormal PrP".
    while len(words) > 1 and words[-1].lower().endswith("ing"):
        words.pop()
    return _tidy(" ".join(words), subject=False)


def extractive_questions(context: str, passages: list[RetrievedDocument], wanted: int) -> list[Candidate]:
    """Questions built from the passages' key sentences, best passages and sentences first.

    A sentence's pattern question comes first ("What is the effect of X on Y?"); without one, its key
    phrase is asked about ("What is known about X?"). A question whose content words the context already
    holds is no follow-up, and is left out; so are repeats. At most two per passage, for variety.
    """
    sentences = [
        (rank, d, s.text)
        for rank, d in enumerate(passages)
        for s in split_sentences(d.chunk.content)
        if len(s.text.split()) >= 5
    ]
    statistics = PhraseStatistics.of(d.chunk.content for d in passages)
    idf = statistics.idf
    context_stems = _content_stems(context)

    # Passages in retrieval order; in each, pattern questions first, then by the sentence's overlap with
    # the context (IDF-weighted), so the follow-ups stay closest to what the reader is on.
    ranked: list[tuple[tuple[int, int, float, int], Candidate]] = []
    for position, (rank, document, text) in enumerate(sentences):
        question = pattern_question(text)
        priority = 0
        if question is None:
            phrase = key_phrase(text, statistics)
            question = f"What is known about {phrase}?" if phrase else None
            priority = 1
        if question is None:
            continue
        overlap = sum(idf[s] for s in _content_stems(text) & context_stems)
        chunk = document.chunk
        candidate = Candidate(question[0].upper() + question[1:], chunk.chunk_id, chunk.document_id, text)
        ranked.append(((rank, priority, -overlap, position), candidate))
    ranked.sort(key=lambda item: item[0])
    return _diverse((c for _, c in ranked), context_stems, wanted)


def _diverse(candidates: Iterable[Candidate], context_stems: set[str], wanted: int) -> list[Candidate]:
    chosen: list[Candidate] = []
    per_chunk: Counter[str] = Counter()
    seen: list[frozenset[str]] = []
    for candidate in candidates:
        stems = frozenset(_content_stems(candidate.question))
        repeats = any(stems <= other or other <= stems for other in seen)
        if not stems - context_stems or repeats or per_chunk[candidate.chunk_id] >= 2:
            continue
        seen.append(stems)
        per_chunk[candidate.chunk_id] += 1
        chosen.append(candidate)
        if len(chosen) == wanted:
            break
    return chosen
