"""4R ranking (options.ranking): relevancy, recency, richness and reputation, combined by weight.

Off unless a call gives options.ranking. Then the technique retrieves `candidates` chunks instead of top_k,
each gets four scores in [0, 1], and the list is reordered by their weighted mean before it is cut to top_k.
score_details.ranking shows the four scores and the overall one. Formulas and examples: docs/ranking.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from iris_rag.errors import InvalidParametersError
from iris_rag.stores.base import StoredChunk
from iris_rag.text import query_terms

# Richness is D / (D + RICHNESS_HALF): D distinct content words in the chunk. At 25 a chunk is half as rich
# as it can be. Words are not stemmed: the pure-Python stemmer took 300 ms for 50 chunks.
RICHNESS_HALF = 25
WEIGHTS = ("relevancy", "recency", "richness", "reputation")
_YEAR_MONTH = re.compile(r"^(\d{4})(?:-(\d{2}))?$")
# The table key that gives every source it does not name a reputation.
ANY_SOURCE = "*"


class RankingOptions(BaseModel):
    """options.ranking (schema: common.json#/$defs/ranking): the four weights and what each score reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    relevancy: float = Field(1.0, ge=0, le=100)
    recency: float = Field(0.0, ge=0, le=100)
    richness: float = Field(0.0, ge=0, le=100)
    reputation: float = Field(0.0, ge=0, le=100)
    date_field: str = "date"
    half_life_days: float = Field(365.0, gt=0, le=36500)
    reputation_field: str | None = None
    reputation_sources: dict[str, float] | None = None
    candidates: int = Field(50, ge=1, le=100)

    def weights(self) -> dict[str, float]:
        """The four weights, normalized to sum to 1."""
        raw = {name: float(getattr(self, name)) for name in WEIGHTS}
        total = sum(raw.values())
        return {name: weight / total for name, weight in raw.items()}


def check_ranking(ranking: RankingOptions) -> None:
    """Refuse weights that rank nothing and a reputation weight with nothing to read it from."""
    if sum(getattr(ranking, name) for name in WEIGHTS) == 0:
        msg = (
            "options.ranking: every weight is 0; give relevancy, recency, richness or reputation a "
            "weight above 0"
        )
        raise InvalidParametersError(msg)
    sources = (ranking.reputation_field is not None) + (ranking.reputation_sources is not None)
    if ranking.reputation > 0 and sources != 1:
        msg = (
            "options.ranking: a reputation weight needs exactly one of reputation_field (a numeric metadata "
            "field) or reputation_sources (a table of source -> 0..1)"
        )
        raise InvalidParametersError(msg)


def pool_size(top_k: int, ranking: RankingOptions) -> int:
    """How many chunks the technique retrieves for reranking: `candidates`, never fewer than top_k."""
    return max(top_k, ranking.candidates)


class Rankable(Protocol):
    """What rerank() needs of a retrieved document (pipeline.RetrievedDocument)."""

    chunk: StoredChunk
    score: float
    details: dict[str, Any]


R = TypeVar("R", bound=Rankable)


def rerank(documents: Sequence[R], ranking: RankingOptions, now: datetime | None = None) -> list[R]:
    """The documents by weighted 4R score, best first (ties keep the technique's order).

    Each document's details gain `ranking`: the four scores, the overall one and its technique_rank.
    """
    if not documents:
        return []
    now = now or datetime.now(UTC)
    weights = ranking.weights()
    relevancy = _min_max([d.score for d in documents])
    reputation = _reputations(documents, ranking)
    scored: list[tuple[float, int, R]] = []
    for position, document in enumerate(documents):
        scores = {
            "relevancy": relevancy[position],
            "recency": recency_score(
                parse_date(document.chunk.metadata.get(ranking.date_field)), now, ranking.half_life_days
            ),
            "richness": richness_score(document.chunk.content),
            "reputation": reputation[position],
        }
        overall = sum(weights[name] * scores[name] for name in WEIGHTS)
        document.details = {
            **document.details,
            "ranking": {
                **{name: round(value, 6) for name, value in scores.items()},
                "overall": round(overall, 6),
                "technique_rank": position + 1,
            },
        }
        scored.append((overall, position, document))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [document for _, _, document in scored]


def _min_max(values: list[float]) -> list[float]:
    """Each value scaled to [0, 1] between the list's lowest and highest; all 1 when they are equal."""
    low, high = min(values), max(values)
    if high == low:
        return [1.0] * len(values)
    return [(value - low) / (high - low) for value in values]


def parse_date(value: object) -> datetime | None:
    """A metadata date: an ISO 8601 date or date-time, a year (2019 or "2019") or "2019-05"; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return datetime(int(value), 1, 1, tzinfo=UTC) if 1 <= value <= 9999 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    match = _YEAR_MONTH.match(text)
    try:
        if match:
            return datetime(int(match[1]), int(match[2] or 1), 1, tzinfo=UTC)
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def recency_score(date: datetime | None, now: datetime, half_life_days: float) -> float:
    """0.5 ** (age in days / half-life): 1 for today (and future dates), 0.5 one half-life ago; 0 undated."""
    if date is None:
        return 0.0
    age_days = max(0.0, (now - date).total_seconds() / 86400)
    return float(0.5 ** (age_days / half_life_days))


def richness_score(text: str) -> float:
    """D / (D + RICHNESS_HALF), D its distinct content words: short, repetitive or stopword text is thin."""
    distinct = sum(1 for term in query_terms(text) if len(term) > 1)
    return distinct / (distinct + RICHNESS_HALF)


def _reputations(documents: Sequence[Rankable], ranking: RankingOptions) -> list[float]:
    """Each document's reputation in [0, 1], from the metadata field or the source table (else 0)."""
    if ranking.reputation_sources is not None:
        table = ranking.reputation_sources
        return [source_reputation(d.chunk.metadata.get("source"), table) for d in documents]
    if ranking.reputation_field is None:
        return [0.0] * len(documents)
    values = [_number(d.chunk.metadata.get(ranking.reputation_field)) for d in documents]
    # Scaled by the highest among the candidates, so a count (citations) and a 0..1 grade both work.
    high = max(values)
    return [value / high if high > 0 else 0.0 for value in values]


def source_reputation(source: object, table: dict[str, float]) -> float:
    """The table's value for the longest key that begins the source ("*" for any other source; else 0)."""
    if isinstance(source, str):
        keys = [key for key in table if key != ANY_SOURCE and source.startswith(key)]
        if keys:
            return float(table[max(keys, key=len)])
    return float(table.get(ANY_SOURCE, 0.0))


def _number(value: object) -> float:
    """A non-negative number from a metadata value (a number, or text holding one); 0 otherwise."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return 0.0
    else:
        return 0.0
    return number if number > 0 and number != float("inf") else 0.0
