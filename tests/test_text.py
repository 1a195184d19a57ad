"""iris_rag.text: the one text module."""

from __future__ import annotations

import re
import sys
import threading

import snowballstemmer

from iris_rag.text import stem


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
