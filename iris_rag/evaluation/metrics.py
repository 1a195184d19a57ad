"""trec_eval's measures through pytrec_eval (as BEIR computes them), averaged over every query in qrels."""

from __future__ import annotations

from typing import Any

import pytrec_eval

from iris_rag.evaluation.beir import Qrels

# Report key → the pytrec_eval result key; MRR@10 comes from a second pass over the top 10 (see score_run).
MEASURES = {"ndcg@10": "ndcg_cut_10", "recall@10": "recall_10", "recall@100": "recall_100"}
MRR_DEPTH = 10
# The deepest cutoff measured (Recall@100): a shallower ranking would understate it.
DEEPEST_CUTOFF = 100


def score_run(qrels: Qrels, rankings: dict[str, list[str]]) -> dict[str, float]:
    """Mean nDCG@10, Recall@10, Recall@100 and MRR@10 of ranked document ids over every query in qrels.

    A query the run has nothing for counts as 0 (pytrec_eval alone would leave it out of the mean).
    """
    per_query = score_queries(qrels, rankings)
    count = len(qrels)
    keys = [*MEASURES, "mrr@10"]
    return {
        key: sum(per_query.get(q, {}).get(key, 0.0) for q in qrels) / count if count else 0.0 for key in keys
    }


def score_queries(qrels: Qrels, rankings: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Each query's measures; the rankings' order is what is scored, never ties between raw scores."""
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10", "recall.100"})
    # trec_eval's recip_rank looks at the whole run; over the run cut at 10 it is exactly MRR@10.
    top = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"})
    measured: dict[str, dict[str, Any]] = full.evaluate(run_scores(rankings, None))
    reciprocal: dict[str, dict[str, Any]] = top.evaluate(run_scores(rankings, MRR_DEPTH))
    return {
        query: {
            **{key: float(values[name]) for key, name in MEASURES.items()},
            "mrr@10": float(reciprocal.get(query, {}).get("recip_rank", 0.0)),
        }
        for query, values in measured.items()
    }


def run_scores(rankings: dict[str, list[str]], depth: int | None = None) -> dict[str, dict[str, float]]:
    """Each query's ranked documents with a score from its rank, cut at `depth`; queries without any left out.

    trec_eval sorts by score (ties broken by document id), so scores come from rank: the order is exact.
    """
    return {
        query: {doc: float(len(docs) - rank) for rank, doc in enumerate(docs[:depth])}
        for query, docs in rankings.items()
        if docs
    }
