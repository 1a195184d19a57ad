import itertools

import pytest

from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.chunking import chunk_text
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.text import Span, split_sentences
from tests.deadline import within

TEXT = (
    "Aspirin lowers risk. It was tested in 2019, e.g. in older adults. Results were clear! "
    "Was it safe? Mostly.\n\nA new paragraph starts here. It has two sentences."
)


def test_sentences_keep_offsets_and_do_not_split_abbreviations() -> None:
    spans = split_sentences(TEXT)
    assert [s.text for s in spans][:3] == [
        "Aspirin lowers risk.",
        "It was tested in 2019, e.g. in older adults.",
        "Results were clear!",
    ]
    assert all(TEXT[s.start : s.end] == s.text for s in spans)
    assert "A new paragraph starts here." in [s.text for s in spans]


def test_chunks_respect_size_end_on_sentences_and_overlap() -> None:
    text = " ".join(f"Sentence number {i} says something about topic {i}." for i in range(60))
    chunks = chunk_text(text, size=300, overlap=100)
    assert len(chunks) > 5
    assert all(len(c.text) <= 300 for c in chunks)
    assert all(c.text.endswith(".") for c in chunks)
    assert all(text[c.start : c.end] == c.text for c in chunks)
    for before, after in itertools.pairwise(chunks):
        assert after.start < before.end, "consecutive chunks overlap"
        assert before.end - after.start <= 100


def test_zero_overlap_and_long_sentences() -> None:
    text = "word " * 500 + ". Short end."
    chunks = chunk_text(text, size=200, overlap=0)
    assert all(len(c.text) <= 200 for c in chunks)
    assert "".join(c.text for c in chunks).replace(" ", "") == text.replace(" ", "")
    sized = chunk_text(TEXT, size=1000, overlap=0)
    assert len(sized) == 1


def test_chunk_size_changes_chunking() -> None:
    text = " ".join(f"Claim {i} is stated in this sentence." for i in range(40))
    assert len(chunk_text(text, size=200, overlap=0)) > len(chunk_text(text, size=800, overlap=0))


@pytest.mark.parametrize("size", [0, -5])
def test_a_size_under_one_is_refused_not_looped_on(size: int) -> None:
    # A long sentence is cut in steps of `size`: a step of 0 or less never reaches its end.
    with pytest.raises(ValueError, match=f"size {size}"):
        within(10, lambda: chunk_text("word " * 100, size=size, overlap=0))


@pytest.mark.parametrize(
    ("size", "overlap", "refused"),
    [
        (-5, -10, "chunk_size -5 is out of range 100-20000"),
        (0, None, "chunk_size 0 is out of range 100-20000"),  # was taken as the default
        (1, 0, "chunk_size 1 is out of range 100-20000"),
        (20_001, None, "chunk_size 20001 is out of range 100-20000"),
        (None, -1, "chunk_overlap -1 is out of range 0-5000"),
        (None, 5001, "chunk_overlap 5001 is out of range 0-5000"),
    ],
)
def test_the_ingestor_holds_a_call_to_the_chunking_settings_limits(
    service: RagService, size: int | None, overlap: int | None, refused: str
) -> None:
    # The worker's own check: not every caller goes through the command line's.
    document = SourceDocument("n1", "A note about photosynthesis in green plants.")
    with pytest.raises(InvalidParametersError, match=refused):
        within(30, lambda: service.ingestor.ingest("c", [document], chunk_size=size, chunk_overlap=overlap))
    assert service.list_collections({})["collections"] == []


def _assert_overlapping_chunks(text: str, chunks: list[Span], size: int, overlap: int) -> None:
    assert all(text[c.start : c.end] == c.text for c in chunks)
    assert all(len(c.text) <= size for c in chunks)
    assert chunks[0].start == 0
    assert chunks[-1].end == len(text)
    for before, after in itertools.pairwise(chunks):
        assert 0 < before.end - after.start <= overlap, "consecutive chunks overlap, by at most the overlap"


def test_chinese_text_is_chunked_on_sentences_with_overlap() -> None:
    # "。" ends a sentence without whitespace after it: the chunks end on sentences and overlap by whole
    # sentences (they were hard cuts every `size` characters, mid-word, without overlap).
    text = "".join(f"第{i}段：这里讨论的是主题{i}，它和其他段落没有关系。" for i in range(120))  # noqa: RUF001
    chunks = chunk_text(text, size=1000, overlap=150)
    assert len(chunks) == 4
    assert all(c.text.endswith("。") and c.text.startswith("第") for c in chunks)
    _assert_overlapping_chunks(text, chunks, 1000, 150)


def test_the_pieces_of_an_over_long_sentence_overlap() -> None:
    # Text without a sentence end or a space is cut hard: its pieces repeat `overlap` characters as
    # sentence-grouped chunks do.
    text = "".join(chr(0x4E00 + i % 500) for i in range(3500))
    chunks = chunk_text(text, size=1000, overlap=150)
    _assert_overlapping_chunks(text, chunks, 1000, 150)
    assert [c.start for c in chunks] == [0, 850, 1700, 2550]
    # With spaces, a piece is cut at one and the next starts at a word within the overlap.
    words = " ".join(f"w{i:04d}" for i in range(700))
    chunks = chunk_text(words, size=1000, overlap=150)
    _assert_overlapping_chunks(words, chunks, 1000, 150)
    assert all(c.text.startswith("w") and words[c.start - 1] == " " for c in chunks[1:])
    assert all(before.end - after.start >= 100 for before, after in itertools.pairwise(chunks))
    # An overlap as large as the size still moves on.
    chunks = within(10, lambda: chunk_text("x" * 1000, size=100, overlap=100))
    assert all(len(c.text) <= 100 for c in chunks) and chunks[-1].end == 1000


def test_german_dates_and_abbreviations_do_not_end_chunks() -> None:
    text = " ".join(
        ["Die Berliner Mauer fiel am 9. November 1989 und wurde von Dr. Schmidt beschrieben."] * 20
    )
    chunks = chunk_text(text, size=300, overlap=100)
    assert all(c.text.startswith("Die Berliner Mauer") and c.text.endswith("beschrieben.") for c in chunks)
