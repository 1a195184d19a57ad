"""iris_rag.text: the one text module."""

# ruff: noqa: RUF001 (the sentence tests are about Chinese, Japanese and Greek text, full-width marks and all)

from __future__ import annotations

import re
import sys
import threading

import pytest
import snowballstemmer

from iris_rag.text import split_sentences, stem


def test_stem_is_safe_across_threads() -> None:
    """Worker threads stem at once (extractive answers, keyword terms): one shared snowball stemmer keeps
    per-word state, and two threads in it gave wrong stems and IndexError under the HTTP load bench."""
    words = ["insulin", "resistance", "angiotensin", "inhibitors", "associated", "functional", "renal"] * 50
    expected = {w: stem(w) for w in set(words)}
    stem_word = stem.__wrapped__  # the stemmer itself: stem() remembers, so its hits would never race
    failures: list[str] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows within a few rounds
    try:

        def run() -> None:
            for _ in range(40):
                for word in words:
                    try:
                        got = stem_word(word)
                    except Exception as error:  # recorded, asserted below
                        failures.append(f"{word}: {type(error).__name__}")
                        return
                    if got != expected[word]:
                        failures.append(f"{word}: {got} != {expected[word]}")
                        return

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert failures == []


def test_stem_remembers_each_word() -> None:
    """stem() is called for every word of every retrieved passage (the extractive answer): a word seen once
    is not stemmed again, and the remembered stem is the stemmer's own."""
    words = ["hypertension", "randomized", "mitochondrial", "hypertension"]
    before = stem.cache_info()
    stems = [stem(w) for w in words]
    assert (
        stems == [stem.__wrapped__(w) for w in words] == ["hypertens", "random", "mitochondri", "hypertens"]
    )
    after = stem.cache_info()
    assert after.hits - before.hits >= 1  # the repeated word at least
    assert stem("hypertension") is stem("hypertension")


def test_the_c_stemmer_stems_as_the_pure_python_porter() -> None:
    """PyStemmer (a dependency) makes snowballstemmer hand out its C stemmers; they must stem exactly as the
    pure-Python Porter stemmer (which FTS5's porter tokenizer matches), word for word."""
    import Stemmer
    from snowballstemmer.porter_stemmer import PorterStemmer

    from tests.conftest import SAMPLE_CORPUS

    words = sorted(
        {w for line in SAMPLE_CORPUS.read_text().splitlines() for w in re.findall(r"\w+", line.lower())}
    )
    assert len(words) > 5_000
    c_stemmer, python_stemmer = Stemmer.Stemmer("porter"), PorterStemmer()
    assert [c_stemmer.stemWord(w) for w in words] == [python_stemmer.stemWord(w) for w in words]
    assert isinstance(snowballstemmer.stemmer("porter"), Stemmer.Stemmer), "the C stemmer is the one used"
    assert [stem.__wrapped__(w) for w in words[:500]] == [python_stemmer.stemWord(w) for w in words[:500]]


def _sentences(text: str) -> list[str]:
    spans = split_sentences(text)
    assert all(text[s.start : s.end] == s.text for s in spans), "offsets point at the sentence"
    return [s.text for s in spans]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # a German day number before a month is no sentence end; the year after the month is
            "Die Berliner Mauer fiel am 9. November 1989. Sie hatte die Stadt seit 1961 geteilt.",
            ["Die Berliner Mauer fiel am 9. November 1989.", "Sie hatte die Stadt seit 1961 geteilt."],
        ),
        (
            "Die Steuererklärung muss bis zum 31. Juli beim Finanzamt sein.",
            ["Die Steuererklärung muss bis zum 31. Juli beim Finanzamt sein."],
        ),
        ("It opened on 1. January 2020.", ["It opened on 1. January 2020."]),
        (
            "Patients with migraine are seen by Dr. Smith on Mondays. Room No. 5 is on the first floor.",
            ["Patients with migraine are seen by Dr. Smith on Mondays.", "Room No. 5 is on the first floor."],
        ),
        (  # SciFact: "vs." before a number, "(ref. 3)", "(Fig. 1)", "et al. (2017)"
            "Rates were 73.1% vs. 68.0% in group A. Both carry HLA-DQ2 (ref. 3). See the domains (Fig. 1). "
            "Oyler-Yaniv et al. (2017) show it. Smith et al. 2019 agree. Pay approx. 15 Euro.",
            [
                "Rates were 73.1% vs. 68.0% in group A.",
                "Both carry HLA-DQ2 (ref. 3).",
                "See the domains (Fig. 1).",
                "Oyler-Yaniv et al. (2017) show it.",
                "Smith et al. 2019 agree.",
                "Pay approx. 15 Euro.",
            ],
        ),
        (
            "Cities (e.g. Paris) and rivers, i.e. Seine. Sie kam z.B. Montags, bzw. Dienstags, Nr. 7.",
            ["Cities (e.g. Paris) and rivers, i.e. Seine.", "Sie kam z.B. Montags, bzw. Dienstags, Nr. 7."],
        ),
        (  # English numbers and words that do end a sentence still end it
            "The wall fell in 1989. The city was one again. It was in group 2. However, not all of it.",
            [
                "The wall fell in 1989.",
                "The city was one again.",
                "It was in group 2.",
                "However, not all of it.",
            ],
        ),
        (
            "Did it work? No. The dose was too low. Genes, proteins, etc. Here, we describe more.",
            [
                "Did it work?",
                "No.",
                "The dose was too low.",
                "Genes, proteins, etc.",
                "Here, we describe more.",
            ],
        ),
        (  # "et al." before a capital, and "No." before a capital, end a sentence
            "Headaches were classified as proposed by Silberstein et al. A psychiatrist saw each patient.",
            [
                "Headaches were classified as proposed by Silberstein et al.",
                "A psychiatrist saw each patient.",
            ],
        ),
        (  # a blank line ends a sentence even after an abbreviation
            "The scheme is shown in Fig.\n\nNext paragraph.",
            ["The scheme is shown in Fig.", "Next paragraph."],
        ),
    ],
)
def test_sentences_end_at_full_stops_not_at_abbreviations_or_day_numbers(
    text: str, expected: list[str]
) -> None:
    assert _sentences(text) == expected


def test_a_sentence_may_start_with_any_uppercase_letter() -> None:
    text = "Er kam spät. Übrigens war es kalt. État de droit. Ørsted kam. Это конец. Ωmega. Ärger!"
    assert _sentences(text) == [
        "Er kam spät.",
        "Übrigens war es kalt.",
        "État de droit.",
        "Ørsted kam.",
        "Это конец.",
        "Ωmega.",
        "Ärger!",
    ]
    # a lowercase letter or a symbol starts none, as before
    assert len(_sentences("Caused by TNF-α. α-synuclein was not. © 2012 Elsevier.")) == 1


def test_closing_quotes_and_brackets_stay_with_their_sentence() -> None:
    text = 'He said "stop." Then he left. (See the appendix.) This fluorescence was designated "B." Next.'
    assert _sentences(text) == [
        'He said "stop."',
        "Then he left.",
        "(See the appendix.)",
        'This fluorescence was designated "B."',
        "Next.",
    ]


def test_chinese_and_japanese_sentences_end_without_whitespace() -> None:
    chinese = "第1段：这里讨论主题。第2段：它没有关系！真的吗？！他说：“我们走吧。”然后他们走了。"
    assert _sentences(chinese) == [
        "第1段：这里讨论主题。",
        "第2段：它没有关系！",
        "真的吗？！",
        "他说：“我们走吧。”",
        "然后他们走了。",
    ]
    japanese = "これはペンです。「はい。」長さは３．５ｍです．次の文です．"
    assert _sentences(japanese) == ["これはペンです。", "「はい。」", "長さは３．５ｍです．", "次の文です．"]
    mixed = "English first. 中文第二。 Third one."
    assert _sentences(mixed) == ["English first.", "中文第二。", "Third one."]
