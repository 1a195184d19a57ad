"""Score and rank fusion: pure functions over scores, unit-testable on their own.

One rule scales every leg, wherever legs are fused (rag_hybrid_ifind's two, rag_crag's three to five): a
score with a natural zero (BM25: no query term) is divided by the best one, any other (cosines) is min-max
scaled over the candidates; a leg that did not score a candidate adds 0 for it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FusedScore:
    """One candidate's score breakdown, so a user can see why it ranked where it did."""

    chunk_id: str
    dense_score: float | None
    keyword_score: float | None
    dense_norm: float
    keyword_norm: float
    dense_rank: int | None
    keyword_rank: int | None
    fused_score: float

    def as_dict(self) -> dict[str, float | int | None]:
        """The wire form."""
        return {
            "dense_score": _round(self.dense_score),
            "keyword_score": _round(self.keyword_score),
            "dense_norm": round(self.dense_norm, 6),
            "keyword_norm": round(self.keyword_norm, 6),
            "dense_rank": self.dense_rank,
            "keyword_rank": self.keyword_rank,
            "fused_score": round(self.fused_score, 6),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _ranks(ranking: list[str]) -> dict[str, int]:
    return {chunk_id: rank for rank, chunk_id in enumerate(ranking, start=1)}


def min_max(scores: Mapping[str, float]) -> dict[str, float]:
    """Scale to [0, 1]; all-equal scores become 1 (they are equally the best)."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return dict.fromkeys(scores, 1.0)
    return {key: (value - low) / (high - low) for key, value in scores.items()}


def scaled(scores: Mapping[str, float], *, natural_zero: bool) -> dict[str, float]:
    """A leg's scores in [0, 1]: divided by the best with a natural zero (BM25), else min-max."""
    if not natural_zero:
        return min_max(scores)
    best = max(scores.values(), default=0.0)
    return {key: value / best if best > 0 else 0.0 for key, value in scores.items()}


@dataclass(frozen=True, slots=True)
class WeightedLeg:
    """One leg's scores and weight, for weighted_sum."""

    weight: float
    scores: Mapping[str, float]
    natural_zero: bool


def weighted_sum(
    legs: Sequence[WeightedLeg], candidates: Collection[str]
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Each candidate's sum of weight x scaled score over the legs, and each leg's scaled scores.

    Scaling is over the candidates' scores only; a leg that did not score a candidate adds 0 (and its
    scaled score there is 0).
    """
    fused = dict.fromkeys(candidates, 0.0)
    per_leg: list[dict[str, float]] = []
    for leg in legs:
        norms = scaled(
            {c: leg.scores[c] for c in candidates if c in leg.scores}, natural_zero=leg.natural_zero
        )
        for candidate in candidates:
            fused[candidate] += leg.weight * norms.get(candidate, 0.0)
        per_leg.append(norms)
    return fused, per_leg


def weighted_fusion(
    dense: dict[str, float],
    keyword: dict[str, float],
    dense_ranking: list[str],
    keyword_ranking: list[str],
    *,
    vector_weight: float,
    keyword_weight: float,
) -> list[FusedScore]:
    """vector_weight * dense_norm + keyword_weight * keyword_norm, best first.

    dense holds the cosine of every candidate (exact, whichever leg found it), min-max scaled over the
    candidates. BM25 has a natural zero (no query term), so keyword scores are divided by the best one;
    a candidate the keyword leg did not return counts 0 there.
    """
    candidates = dense.keys() | keyword.keys()
    totals, (dense_norm, keyword_norm) = weighted_sum(
        [
            WeightedLeg(vector_weight, dense, natural_zero=False),
            WeightedLeg(keyword_weight, keyword, natural_zero=True),
        ],
        candidates,
    )
    dense_ranks, keyword_ranks = _ranks(dense_ranking), _ranks(keyword_ranking)
    fused = [
        FusedScore(
            chunk_id,
            dense.get(chunk_id),
            keyword.get(chunk_id),
            dense_norm.get(chunk_id, 0.0),
            keyword_norm.get(chunk_id, 0.0),
            dense_ranks.get(chunk_id),
            keyword_ranks.get(chunk_id),
            totals[chunk_id],
        )
        for chunk_id in candidates
    ]
    return sorted(fused, key=lambda f: (-f.fused_score, f.chunk_id))


def reciprocal_rank_fusion(
    dense: dict[str, float],
    keyword: dict[str, float],
    dense_ranking: list[str],
    keyword_ranking: list[str],
    *,
    vector_weight: float,
    keyword_weight: float,
    k: int = 60,
) -> list[FusedScore]:
    """Weighted RRF: vector_weight / (k + dense_rank) + keyword_weight / (k + keyword_rank), best first.

    With equal weights this is the classic RRF of Cormack et al. (2009); a leg that did not return a
    candidate adds nothing for it.
    """
    dense_norm, keyword_norm = scaled(dense, natural_zero=False), scaled(keyword, natural_zero=True)
    dense_ranks, keyword_ranks = _ranks(dense_ranking), _ranks(keyword_ranking)
    fused = []
    for chunk_id in dense.keys() | keyword.keys():
        d_rank, k_rank = dense_ranks.get(chunk_id), keyword_ranks.get(chunk_id)
        score = (vector_weight / (k + d_rank) if d_rank else 0.0) + (
            keyword_weight / (k + k_rank) if k_rank else 0.0
        )
        fused.append(
            FusedScore(
                chunk_id,
                dense.get(chunk_id),
                keyword.get(chunk_id),
                dense_norm.get(chunk_id, 0.0),
                keyword_norm.get(chunk_id, 0.0),
                d_rank,
                k_rank,
                score,
            )
        )
    return sorted(fused, key=lambda f: (-f.fused_score, f.chunk_id))


RERANK_WEIGHT = 1 / 3
"""late_interaction_rerank: each leg's weight (dense, BM25, late interaction): equal thirds, not tuned."""


@dataclass(frozen=True, slots=True)
class Reranked:
    """A fused candidate re-scored with a late-interaction leg (late_interaction_rerank)."""

    first: FusedScore
    late_score: float | None
    late_norm: float
    score: float

    @property
    def chunk_id(self) -> str:
        """The candidate's chunk."""
        return self.first.chunk_id

    def as_dict(self) -> dict[str, float | int | None]:
        """The wire form: the first pass's breakdown, its score, the late leg and the new fused score."""
        return {
            **self.first.as_dict(),
            "first_pass_score": round(self.first.fused_score, 6),
            "late_interaction_score": _round(self.late_score),
            "late_interaction_norm": round(self.late_norm, 6),
            "fused_score": round(self.score, 6),
        }


def late_interaction_rerank(
    fused: Sequence[FusedScore], late: Mapping[str, float], depth: int
) -> list[Reranked]:
    """The first `depth` candidates of a fused ranking re-fused with a late-interaction leg, best first.

    Each of the three legs weighs RERANK_WEIGHT and is scaled over those candidates only, by the module's
    rule: the dense cosines and the late-interaction scores min-max, BM25 divided by the best; a leg that
    did not score a candidate adds 0. Candidates past `depth` follow in the fusion's order, each scored
    its first-pass score times the re-ranked head's lowest score over the head's lowest first-pass score,
    so the scores still fall down the list.
    """
    head, tail = list(fused[:depth]), list(fused[depth:])
    ids = [f.chunk_id for f in head]
    totals, (_, _, late_norm) = weighted_sum(
        [
            WeightedLeg(
                RERANK_WEIGHT,
                {f.chunk_id: f.dense_score for f in head if f.dense_score is not None},
                natural_zero=False,
            ),
            WeightedLeg(
                RERANK_WEIGHT,
                {f.chunk_id: f.keyword_score for f in head if f.keyword_score is not None},
                natural_zero=True,
            ),
            WeightedLeg(RERANK_WEIGHT, {c: late[c] for c in ids if c in late}, natural_zero=False),
        ],
        ids,
    )
    reranked = sorted(
        (Reranked(f, late.get(f.chunk_id), late_norm.get(f.chunk_id, 0.0), totals[f.chunk_id]) for f in head),
        key=lambda r: (-r.score, r.chunk_id),
    )
    if not tail or not head:
        return reranked
    floor, first_floor = reranked[-1].score, min(f.fused_score for f in head)
    scale = floor / first_floor if first_floor > 0 else 0.0
    return reranked + [Reranked(f, None, 0.0, max(0.0, f.fused_score * scale)) for f in tail]
