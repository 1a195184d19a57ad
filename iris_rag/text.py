"""Text processing shared by ingestion, retrieval and answers.

Sentences, terms, the stemmer, stopwords, what is embedded for a chunk, and chunk ids: one home, so that
every part splits and matches text alike.
"""

from __future__ import annotations

import csv
import io
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import snowballstemmer

# A sentence ends at . ! ? and the closing quotes or brackets after it, before whitespace and what starts a
# sentence: an uppercase letter (of any script), a letter of a script without case (Chinese, Arabic...), a
# digit, an opening quote or bracket. The regex takes any non-ASCII character after the whitespace as a
# candidate and _starts_sentence keeps the letters that are not lowercase. A "." ends no sentence after a
# known abbreviation ("Dr. Smith", "e.g. Paris", "No. 5") nor after a day number before a month name
# ("9. November", "31. Juli"); other numbers end one ("in 1989. The", "group 2. However"). "e.g." before a
# lowercase word never did. The Chinese and Japanese full stop, exclamation and question marks (and a
# full-width full stop not before a digit) end one with no whitespace after them, as those languages write
# them. A blank line always ends one.
# (Escaped: ruff flags full-width and curly characters in source.) Closing: right double and single quotes,
# right guillemet, CJK corner and white corner brackets, full-width parenthesis, black lenticular, tortoise
# shell, angle and double angle brackets. Opening: their left forms, low double quote, inverted ? and !.
_CLOSERS = "\"')\\]\u201d\u2019\u00bb\u300d\u300f\uff09\u3011\u3015\u3009\u300b"
_OPENERS = "\u201c\u2018\u00ab\u201e\u00bf\u00a1\u300c\u300e\uff08\u3010"
_CJK_STOPS = "\u3002\uff01\uff1f\uff61"  # ideographic full stop, full-width ! and ?, half-width full stop
_FULL_WIDTH_STOP = "\uff0e"
_SENTENCE_END = re.compile(
    rf"(?=[.!?{_CJK_STOPS}{_FULL_WIDTH_STOP}\n])(?:"  # (a leading class lets the regex engine skip ahead)
    rf"[.!?][{_CLOSERS}]*(?=\s+(?P<next>[A-Z0-9\"'(\[]|[^\x00-\x7f]))"
    rf"|(?:[{_CJK_STOPS}]|{_FULL_WIDTH_STOP}(?![0-9\uff10-\uff19]))+[{_CLOSERS}]*"
    r"|\n\s*\n)"
)
# Never the end of a sentence (case-sensitive: "No." and "Ca." can end one). Not "etc." nor "usw.": they
# end sentences as often as not ("... genome, etc. Here, we describe" in SciFact).
_ABBREVIATIONS = frozenset(
    (
        "Dr Drs Mr Mrs Ms Prof St Jr Sr Fig Figs fig figs Eq Eqs eq eqs Ref Refs ref refs Vol Vols vol vols "
        "pp vs cf Cf approx ca e.g E.g i.e I.e viz Nr bzw vgl Vgl z.B Z.B d.h D.h"
    ).split()
)
# Not the end of a sentence before a number or a bracket: "No. 5", "p. 12", "Jan. 5", "et al. (2019)"; but
# "... proposed by Smith et al. A second ..." is.
_NUMBER_ABBREVIATIONS = frozenset(
    "No Nos no nos p al Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec".split()
)
_LONGEST_ABBREVIATION = max(len(a) for a in _ABBREVIATIONS | _NUMBER_ABBREVIATIONS)
# English and German month names after a day number, as German writes dates: "am 9. November".
_MONTH = re.compile(
    r"\s+(?:January|Januar|J\u00e4nner|February|Februar|March|M\u00e4rz|April|May|Mai|June|Juni|July|Juli"
    r"|August|September|October|Oktober|November|December|Dezember)\b"
)
_TERM = re.compile(r"\w+", re.UNICODE)
# A snowball stemmer keeps the word it is working on in the object: one per thread, or two worker threads
# stemming at once corrupt each other's word (wrong stems, IndexError).
_stemmers = threading.local()
# Distinct words whose stems are remembered (a few MB); SciFact's 5,183 abstracts use about 36,000.
STEM_CACHE_WORDS = 1 << 16
# Function words carry no evidence and make every OR query scan most of the index.
STOPWORDS = frozenset(
    (
        "a an and are as at be been being but by can could did do does for from had has have how i if in "
        "into is it its of on or our so such than that the their them then there these they this those to "
        "was we were what when where which while who whom why will with would you your"
    ).split()
)


@dataclass(frozen=True, slots=True)
class Span:
    """A piece of a document's text with its character offsets."""

    text: str
    start: int
    end: int


def split_sentences(text: str) -> list[Span]:
    """Split text into sentences with their offsets; whitespace between them is dropped."""
    spans: list[Span] = []
    position = 0
    for match in _SENTENCE_END.finditer(text):
        following = match.start("next")
        if following >= 0 and not _starts_sentence(text, match.start(), following):
            continue
        _append_stripped(spans, text, position, match.end())
        position = match.end()
    _append_stripped(spans, text, position, len(text))
    return spans


def _starts_sentence(text: str, stop: int, following: int) -> bool:
    """Whether the . ! ? at `stop` ends a sentence, the next one starting at `following`."""
    first = text[following]
    if first >= "\x80" and not ((first.isalpha() and not first.islower()) or first in _OPENERS):
        return False  # a lowercase letter ("é", Greek alpha) or a symbol ("©", "—")
    if text[stop] != ".":
        return True
    # The word before the full stop: a window one longer than any abbreviation holds all of one.
    words = text[max(0, stop - _LONGEST_ABBREVIATION - 1) : stop].split()
    word = words[-1].lstrip(f"([\"'{_OPENERS}") if words else ""
    if word in _ABBREVIATIONS or (word in _NUMBER_ABBREVIATIONS and (first.isdigit() or first in "([")):
        return False
    return not (len(word) <= 2 and word.isdigit() and _MONTH.match(text, stop + 1) is not None)


def _append_stripped(spans: list[Span], text: str, start: int, end: int) -> None:
    piece = text[start:end]
    stripped = piece.strip()
    if stripped:
        offset = start + (len(piece) - len(piece.lstrip()))
        spans.append(Span(stripped, offset, offset + len(stripped)))


# Chinese, Japanese and Korean characters: a word each, near enough, where no space separates words.
_WIDE = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def word_count(text: str) -> int:
    """Words, for a length limit: whitespace-separated, each Chinese, Japanese or Korean character one."""
    wide = len(_WIDE.findall(text))
    return wide + len(_WIDE.sub(" ", text).split()) if wide else len(text.split())


def query_terms(text: str) -> list[str]:
    """The distinct lowercase terms of a text, stopwords removed, in order."""
    terms = [t for t in _TERM.findall(text.lower()) if t not in STOPWORDS]
    return list(dict.fromkeys(terms))


@lru_cache(maxsize=STEM_CACHE_WORDS)
def stem(term: str) -> str:
    """The Porter stem, as FTS5's porter tokenizer stores the term (remembered: a word's stem never changes).

    The extractive answer stems every word of the retrieved passages (about 350 a call): with the pure-
    Python stemmer (about 15-30 us a word) that was a third of a rag_basic call (docs/benchmarks.md,
    "Where rag_basic's time goes"). snowballstemmer hands out PyStemmer's C stemmers (a dependency; the
    same stems, tests/test_text.py), about 1 us a word, and a vocabulary repeats, so most words are hits.
    """
    stemmer = getattr(_stemmers, "porter", None)
    if stemmer is None:
        stemmer = _stemmers.porter = snowballstemmer.stemmer("porter")
    return str(stemmer.stemWord(term))


def is_utf8(text: str) -> bool:
    """Whether the text can be stored: no lone surrogate (what Python keeps of a name's non-UTF-8 bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def without_nul(value: Any) -> Any:
    """The value with no NUL character in any of its strings (those in lists and mappings too).

    Every store gets text without one: PostgreSQL's text and jsonb refuse it (the whole write would fail),
    SQLite's length() stops at it, and it carries no meaning in text.
    """
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {without_nul(key): without_nul(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    return value


class CsvProblem(ValueError):
    """A CSV that cannot be read further: the line its bad record starts on, and why."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


CSV_DELIMITERS = (",", "\t", ";", "|")


def csv_delimiter(text: str) -> str:
    """The delimiter (',', tab, ';' or '|') the first non-blank line uses most: ',' when it has none.

    Spreadsheets in many locales save ';'-separated files, and exported tables are often tab-separated.
    """
    first_line = next((line for line in text.splitlines() if line.strip()), "")
    counts = {d: first_line.count(d) for d in CSV_DELIMITERS}
    return max(counts, key=lambda d: counts[d]) if any(counts.values()) else ","


def csv_records(text: str, delimiter: str = ",") -> Iterator[tuple[int, list[str]]]:
    """Each record of a CSV text with the line it starts on (a quoted field may hold line breaks).

    Strict: an unclosed quote raises CsvProblem at its record's first line, where a lenient reader would
    read the rest of the file into one field. The text is one stream, so quoted line breaks are kept.
    """
    csv.field_size_limit(sys.maxsize)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    ended = 0  # the line the last record read ended on
    try:
        for record in reader:
            yield ended + 1, record
            ended = reader.line_num
    except csv.Error as exc:
        reason = "a quoted field is never closed" if str(exc) == "unexpected end of data" else str(exc)
        raise CsvProblem(ended + 1, reason) from None


def embedding_text(title: str, chunk: str) -> str:
    """What is embedded for a chunk: its document's title gives it context (as BEIR encodes title + text)."""
    return f"{title}\n{chunk}" if title else chunk


def chunk_id(document_id: str, index: int) -> str:
    """The id of a document's index-th chunk, the same in every store and technique."""
    return f"{document_id}#{index}"
