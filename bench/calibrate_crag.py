"""Calibrate rag_crag's retrieval evaluator on a BEIR train split, and tune its verdict thresholds.

    RAG_DATA_DIR=/tmp/crag-data .venv/bin/python -m bench.calibrate_crag --dataset /work/shared/data/scifact

For every train query the real pipeline's first pass computes the evaluator features (iris_rag.pipelines.
crag.evaluator_features) and the label "a relevant document is among the dense top 10". A logistic
regression (Newton's method, L2 1e-3) is compared across feature subsets by 5-fold cross-validated
log-loss and AUC, then fit on every query; the printed constants go into crag.py. With --tune, every
query is also corrected under both low verdicts (the rewrite strategy, without an LLM) and nDCG@10 is
reported over a grid of (confidence_threshold, incorrect_threshold), using out-of-fold confidences.
The test split is refused: it is for reporting only.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from iris_rag.evaluation.beir import load_beir
from iris_rag.evaluation.collection import collection_name, ensure_collection
from iris_rag.evaluation.harness import document_ranking
from iris_rag.evaluation.metrics import score_queries
from iris_rag.pipeline import QueryOptions, RetrievedDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import CollectionInfo
from iris_rag.techniques.crag import (
    CANDIDATE_POOL,
    EVALUATOR_DEPTH,
    EVALUATOR_WEIGHTS,
    CragParams,
    CragPipeline,
    FirstPass,
    Verdict,
)

Matrix = npt.NDArray[np.float64]
CANDIDATES = ["top1", *EVALUATOR_WEIGHTS]
FOLDS = 5
L2 = 1e-3
LOW_VERDICTS: tuple[Verdict, ...] = ("ambiguous", "incorrect")


def _documents(first: FirstPass) -> list[RetrievedDocument]:
    return [RetrievedDocument(c, h.score) for c, h in zip(first.chunks, first.dense, strict=True)]


def fit_logistic(x: Matrix, y: Matrix, l2: float = L2, iterations: int = 50) -> Matrix:
    """Intercept and weights of an L2-penalized logistic regression (the intercept is not penalized)."""
    design = np.hstack([np.ones((len(x), 1)), x])
    weights = np.zeros(design.shape[1])
    penalty = l2 * np.diag(np.r_[0.0, np.ones(design.shape[1] - 1)])
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-design @ weights))
        gradient = design.T @ (p - y) + penalty @ weights
        hessian = (design * (p * (1 - p))[:, None]).T @ design + penalty
        step = np.linalg.solve(hessian, gradient)
        weights -= step
        if np.abs(step).max() < 1e-10:
            break
    return weights


def predict(weights: Matrix, x: Matrix) -> Matrix:
    """P(y = 1 | x)."""
    result: Matrix = 1 / (1 + np.exp(-(weights[0] + x @ weights[1:])))
    return result


def auc(p: Matrix, y: Matrix) -> float:
    """Area under the ROC curve (Mann-Whitney)."""
    order = np.argsort(p)
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    positive = y == 1
    n_pos, n_neg = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def out_of_fold(x: Matrix, y: Matrix, folds: npt.NDArray[np.int64]) -> Matrix:
    """Each query's probability from a model fit without its fold."""
    p = np.zeros(len(y))
    for fold in range(FOLDS):
        train = folds != fold
        p[~train] = predict(fit_logistic(x[train], y[train]), x[~train])
    return p


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", required=True, help="BEIR folder (corpus.jsonl, queries, qrels/)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit-queries", type=int, default=None)
    parser.add_argument("--tune", action="store_true", help="also grid the verdict thresholds by nDCG@10")
    args = parser.parse_args()
    if args.split == "test":
        parser.error("calibrate on the train split: test is for reporting only")

    settings = Settings()
    service = RagService(settings)
    dataset = load_beir(Path(args.dataset), args.split)
    if args.limit_queries:
        dataset = dataset.limited(args.limit_queries)
    collection_id = collection_name(dataset.name, settings.chunk_size, settings.chunk_overlap)
    ensure_collection(service, dataset, collection_id, chunking=(settings.chunk_size, settings.chunk_overlap))
    service.embedder.wait_ready()
    pipeline = service.pipelines["crag"]
    assert isinstance(pipeline, CragPipeline)
    collection = pipeline.resolve_collection(collection_id)

    started = time.perf_counter()
    rows: list[list[float]] = []
    labels: list[float] = []
    firsts: dict[str, FirstPass] = {}
    for number, (query_id, text) in enumerate(dataset.queries.items(), start=1):
        first = pipeline.first_pass(text, collection, None, CANDIDATE_POOL)
        firsts[query_id] = first
        top1 = first.dense[0].score if first.dense else 0.0
        rows.append([top1, *(first.assessment.features[name] for name in EVALUATOR_WEIGHTS)])
        top = document_ranking(_documents(first), EVALUATOR_DEPTH, exclude=query_id)
        labels.append(1.0 if any(dataset.qrels[query_id].get(d, 0) > 0 for d in top) else 0.0)
        if number % 100 == 0:
            print(f"{number} queries, {time.perf_counter() - started:.0f}s", file=sys.stderr)
    x, y = np.array(rows), np.array(labels)
    folds = np.random.default_rng(0).integers(0, FOLDS, len(y))
    print(
        f"{len(y)} {args.split} queries; share with a relevant document in the dense top 10: {y.mean():.4f}"
    )

    results = []
    for size in range(1, len(CANDIDATES) + 1):
        for subset in itertools.combinations(range(len(CANDIDATES)), size):
            p = out_of_fold(x[:, subset], y, folds)
            loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
            results.append((loss, auc(p, y), [CANDIDATES[i] for i in subset]))
    print("\nfeature subsets by 5-fold cross-validated log-loss (best 8):")
    for loss, area, names in sorted(results)[:8]:
        print(f"  log-loss {loss:.4f}  AUC {area:.4f}  {', '.join(names)}")

    chosen = [CANDIDATES.index(name) for name in EVALUATOR_WEIGHTS]
    weights = fit_logistic(x[:, chosen], y)
    p_cv = out_of_fold(x[:, chosen], y, folds)
    loss = float(-np.mean(y * np.log(p_cv) + (1 - y) * np.log(1 - p_cv)))
    print(f"\nchosen features {list(EVALUATOR_WEIGHTS)}: CV log-loss {loss:.4f}, AUC {auc(p_cv, y):.4f}")
    print("reliability (out-of-fold confidence bin: queries, mean confidence, share correct):")
    for low, high in ((0, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 1.01)):
        mask = (p_cv >= low) & (p_cv < high)
        if mask.any():
            share, mean = y[mask].mean(), p_cv[mask].mean()
            print(f"  [{low:.1f}, {min(high, 1):.1f}): {mask.sum():4d}  {mean:.3f}  {share:.3f}")
    print("\nconstants for iris_rag/techniques/crag.py:")
    print(f"EVALUATOR_INTERCEPT = {weights[0]:.6f}")
    print("EVALUATOR_WEIGHTS: dict[str, float] = {")
    for name, value in zip(EVALUATOR_WEIGHTS, weights[1:], strict=True):
        print(f'    "{name}": {value:.6f},')
    print("}")

    if args.tune:
        tune(
            pipeline,
            collection,
            dataset.qrels,
            dataset.queries,
            firsts,
            dict(zip(dataset.queries, p_cv, strict=True)),
        )
    return 0


def tune(
    pipeline: CragPipeline,
    collection: CollectionInfo,
    qrels: dict[str, dict[str, int]],
    queries: dict[str, str],
    firsts: dict[str, FirstPass],
    confidence: dict[str, float],
) -> None:
    """nDCG@10 over a grid of thresholds, each query's three verdict rankings computed once."""
    options = QueryOptions(generate=False, top_k=30)
    params = CragParams(confidence_threshold=1.0, incorrect_threshold=0.0)
    rankings: dict[str, dict[str, list[str]]] = {"correct": {}, "ambiguous": {}, "incorrect": {}}
    for query_id, text in queries.items():
        first = firsts[query_id]
        rankings["correct"][query_id] = document_ranking(_documents(first), 10, exclude=query_id)
        for verdict in LOW_VERDICTS:
            documents, _ = pipeline.correct(text, collection, options, params, first, verdict)
            rankings[verdict][query_id] = document_ranking(documents, 10, exclude=query_id)
    ndcg = {v: {q: s["ndcg@10"] for q, s in score_queries(qrels, r).items()} for v, r in rankings.items()}
    print(
        "\nnDCG@10 by thresholds (rows: confidence_threshold, columns: incorrect_threshold; rewrite, no LLM):"
    )
    lows = [0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    print("        " + " ".join(f"{low:6.1f}" for low in lows))
    for high in (0.6, 0.7, 0.8, 0.9, 1.0):
        cells = []
        for low in lows:
            if low > high:
                cells.append("     -")
                continue
            total = 0.0
            for query_id in queries:
                c = confidence[query_id]
                verdict = "correct" if c >= high else "incorrect" if c < low else "ambiguous"
                total += ndcg[verdict].get(query_id, 0.0)
            cells.append(f"{total / len(queries):6.4f}")
        print(f"  {high:4.1f}  " + " ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
