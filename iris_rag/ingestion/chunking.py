"""Sentence-aware chunking: chunks end on sentence boundaries and overlap by whole sentences."""

from __future__ import annotations

from iris_rag.text import Span, split_sentences


def _split_long(span: Span, size: int, overlap: int) -> list[Span]:
    """Cut a sentence longer than the chunk size at whitespace (or hard, if there is none).

    Each piece repeats up to `overlap` characters of the one before, from a word's start where there is
    one, as chunks of whole sentences repeat their last sentences: text without spaces or sentence ends
    (a long URL, a table row, unsplittable text) loses no context at a cut. The repeat is at most half the
    piece before, so every piece moves on.
    """
    pieces: list[Span] = []
    start = 0
    text = span.text
    while True:
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        piece = text[start:end].strip()
        if piece:
            offset = span.start + start + (len(text[start:end]) - len(text[start:end].lstrip()))
            pieces.append(Span(piece, offset, offset + len(piece)))
        if end >= len(text):
            return pieces
        repeat = end - min(overlap, (end - start) // 2)
        space = text.find(" ", repeat, end)
        start = space + 1 if space >= 0 else repeat


def chunk_text(text: str, *, size: int, overlap: int) -> list[Span]:
    """Group sentences into chunks of at most `size` characters, repeating up to `overlap` characters."""
    if size < 1:  # a long sentence is cut in steps of `size`: such a step never reaches its end
        msg = f"chunk size {size} must be at least 1"
        raise ValueError(msg)
    sentences: list[Span] = []
    for sentence in split_sentences(text):
        sentences.extend(_split_long(sentence, size, overlap) if len(sentence.text) > size else [sentence])
    chunks: list[Span] = []
    current: list[Span] = []
    for sentence in sentences:
        if current and sentence.end - current[0].start > size:
            chunks.append(_join(text, current))
            current = _overlap_tail(current, overlap, room=size - len(sentence.text))
        current.append(sentence)
    if current:
        chunks.append(_join(text, current))
    return chunks


def _overlap_tail(sentences: list[Span], overlap: int, room: int) -> list[Span]:
    """The trailing sentences that fit in the overlap (and still leave room for the next sentence)."""
    tail: list[Span] = []
    for sentence in reversed(sentences):
        length = sentences[-1].end - sentence.start
        if length > min(overlap, room):
            break
        tail.insert(0, sentence)
    return tail


def _join(text: str, sentences: list[Span]) -> Span:
    start, end = sentences[0].start, sentences[-1].end
    return Span(text[start:end], start, end)
