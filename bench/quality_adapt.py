"""Issue 17, item 2: the collection's own model adapted to the collection, without judgments.

    .venv/bin/python -m bench.quality_adapt train /tmp/signals.pkl --pairs ict --out /tmp/adapted-ict.pkl
    .venv/bin/python -m bench.quality_adapt score /tmp/signals.pkl /tmp/adapted-ict.pkl --split train \
        --json bench/results/quality/adapt_ict_train.json

Unsupervised domain adaptation: a copy of the collection's embedding model (the same 22M parameters) is
fine-tuned on pairs made from the collection's own text, then every chunk and query is embedded again. The
pairs need no queries and no judgments, so the method would carry to any collection:

- `ict`, the inverse cloze task (Lee, Chang and Toutanova, 2019): one sentence of a chunk stands in for a
  query, and the chunk with its title, less that sentence (kept in 10 % of pairs, as they do), is its
  passage. SciFact's claims are single statements checked against a sentence of an abstract, which is
  what this task imitates; a collection whose queries are questions or keywords would not be.
- `title`: a document's title is the query, the chunk's text without the title the passage.

One pair per document (one of its chunks at random), so no batch holds two pairs of one document; in-batch
negatives with the multiple-negatives ranking loss (sentence-transformers' default scale 20), AdamW,
linear warm-up over a tenth of the steps then linear decay. With `--negatives` each pair also brings a
chunk of another document that BM25 ranks high for its pseudo-query, as a hard negative (random in-batch
negatives are easy for a model already trained on a billion pairs: the loss is about 0.2 from the start).
`train` writes the `bench.quality_signals` pickle again with the adapted model's chunk and query vectors
(the sentence and title vectors are the original model's and unused here); `score` ranks a split with
both and pairs each per query against the original model's fusion (`today`). Figures: docs/benchmarks.md,
"The model adapted to the collection, without judgments".
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.quality_signals import (
    Bm25,
    Floats,
    Signals,
    Variants,
    _documents,
    _measures,
    _paired,
    _queries,
    embed,
)
from iris_rag.evaluation.beir import load_beir
from iris_rag.settings import Settings
from iris_rag.text import embedding_text, split_sentences

KEEP_SENTENCE = 0.1
"""Lee et al. (2019) leave the pseudo-query sentence in its passage this often."""
NEGATIVE_DEPTH = 10
"""A mined negative is one of this many best BM25 chunks of other documents."""


def pairs(signals: Signals, kind: str, seed: int) -> list[tuple[str, str, int]]:
    """One (pseudo-query, passage, chunk row) triple per document, from one of its chunks at random."""
    chosen = random.Random(seed)
    by_document: dict[str, list[int]] = {}
    for row, document_id in enumerate(signals.document_ids):
        by_document.setdefault(document_id, []).append(row)
    made: list[tuple[str, str, int]] = []
    for rows in by_document.values():
        row = chosen.choice(rows)
        title, text = signals.titles[row], signals.texts[row]
        if kind == "title":
            if title:
                made.append((title, text, row))
            continue
        sentences = [span.text for span in split_sentences(text)]
        if len(sentences) < 2:
            continue
        picked = chosen.randrange(len(sentences))
        rest = sentences if chosen.random() < KEEP_SENTENCE else sentences[:picked] + sentences[picked + 1 :]
        made.append((sentences[picked], embedding_text(title, " ".join(rest)), row))
    chosen.shuffle(made)
    return made


def hard_negatives(signals: Signals, made: list[tuple[str, str, int]], seed: int) -> list[str]:
    """For each pair, a chunk of another document that BM25 ranks high for its pseudo-query.

    One of the best NEGATIVE_DEPTH chunks of other documents, at random (the very top is the likeliest to be
    relevant after all), embedded as ingest embeds it.
    """
    bm25 = Bm25(signals.titles, signals.texts)
    chosen = random.Random(seed)
    negatives = []
    for query, _, row in made:
        owner = signals.document_ids[row]
        scores = bm25.scores(query)
        ranked = [
            r for r in np.argsort(-scores)[: 4 * NEGATIVE_DEPTH].tolist() if signals.document_ids[r] != owner
        ]
        other = chosen.choice(ranked[:NEGATIVE_DEPTH]) if ranked else chosen.randrange(len(signals.texts))
        negatives.append(embedding_text(signals.titles[other], signals.texts[other]))
    return negatives


def train(
    signals: Signals, kind: str, *, negatives: bool, epochs: int, rate: float, batch: int, seed: int
) -> tuple[Any, dict[str, Any]]:
    """Fine-tune a copy of the collection's model on the pairs; returns it and what the run took."""
    import torch
    from sentence_transformers import SentenceTransformer

    from iris_rag.embedder import resolve_model_path

    torch.manual_seed(seed)
    model = SentenceTransformer(resolve_model_path(Settings().embedding_model), device="cpu")
    made = pairs(signals, kind, seed)
    mined = hard_negatives(signals, made, seed) if negatives else None
    examples = [(q, p, mined[i] if mined else "") for i, (q, p, _) in enumerate(made)]
    steps = epochs * (len(examples) // batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=rate)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup)))
    )
    model.train()
    started, losses = time.perf_counter(), []
    for epoch in range(epochs):
        random.Random(seed + epoch).shuffle(examples)
        for step in range(len(examples) // batch):
            queries, passages, others = zip(*examples[step * batch : (step + 1) * batch], strict=True)
            sides = [queries, passages + others] if mined else [queries, passages]
            embedded = [
                torch.nn.functional.normalize(
                    model(model.preprocess(list(side)))["sentence_embedding"], dim=-1
                )
                for side in sides
            ]
            # each query against every passage of the batch (and every mined negative): its own is the answer
            loss = torch.nn.functional.cross_entropy(20.0 * embedded[0] @ embedded[1].T, torch.arange(batch))
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
            if step % 20 == 0:
                print(
                    f"epoch {epoch} step {step}/{steps // epochs} loss {np.mean(losses[-20:]):.4f}",
                    file=sys.stderr,
                )
    model.eval()
    return model, {
        "pairs": len(examples),
        "negatives": "bm25" if mined else "in-batch",
        "steps": steps,
        "train_seconds": round(time.perf_counter() - started, 1),
        "first_loss": round(float(np.mean(losses[:20])), 4),
        "last_loss": round(float(np.mean(losses[-20:])), 4),
    }


def reencode(model: Any, signals: Signals) -> tuple[Signals, float]:
    """The signals with every chunk (title and text, as ingest embeds it) and query embedded again."""

    started = time.perf_counter()
    texts = [embedding_text(t, x) for t, x in zip(signals.titles, signals.texts, strict=True)]
    fields = signals.fields()
    fields.update(
        chunk_vectors=embed(model, texts), query_vectors=embed(model, list(signals.queries.values()))
    )
    return Signals(**fields), time.perf_counter() - started


def _ranked(signals: Signals, bm25: Bm25, queries: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """Dense alone and today's fusion for every query (bench.quality_signals' variants of those names)."""
    variants = Variants(signals, bm25).all()
    rankings: dict[str, dict[str, list[str]]] = {"dense alone": {}, "today": {}}
    for query_id, query in _queries(signals, bm25, queries):
        for name, ranking in rankings.items():
            scores = variants[name](query)
            assert not isinstance(scores, tuple)  # both score today's candidates
            ranking[query_id] = _documents(signals, query.candidates, scores)
    return rankings


def score(original: Signals, adapted: Signals, dataset: Path, split: str) -> dict[str, Any]:
    """Dense alone and fused, with each model's vectors, paired against the original model's fusion."""
    qrels = load_beir(dataset, split).qrels
    queries = {q: original.queries[q] for q in qrels}
    bm25 = Bm25(original.titles, original.texts)
    measured: dict[str, tuple[Floats, Floats]] = {}
    for model, signals in (("original", original), ("adapted", adapted)):
        for name, ranking in _ranked(signals, bm25, queries).items():
            measured[f"{name}, {model} model"] = _measures(qrels, ranking)
    baseline = measured["today, original model"][0]
    dense = measured["dense alone, original model"][0]
    report: dict[str, Any] = {}
    for name, (ndcg, recall) in measured.items():
        against = dense if name.startswith("dense") else baseline
        report[name] = {"recall@100": round(float(recall.mean()), 4), **_paired(ndcg, against)}
        print(
            f"{split:5} {name:32} nDCG@10 {ndcg.mean():.4f} R@100 {recall.mean():.4f}"
            f"  {report[name]['ndcg@10_difference']:+.4f} ± {report[name]['standard_error']:.4f}",
            file=sys.stderr,
        )
    return {"split": split, "queries": len(qrels), "variants": report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality_adapt", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train", help="adapt a copy of the model, embed chunks and queries again")
    t.add_argument("signals", type=Path, help="the pickle bench.quality_signals encode wrote")
    t.add_argument("--pairs", choices=("ict", "title"), default="ict")
    t.add_argument("--negatives", action="store_true", help="add one BM25-mined negative per pair")
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--rate", type=float, default=2e-5)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", type=Path, required=True)
    s = commands.add_parser("score", help="the original and the adapted model on one split")
    s.add_argument("signals", type=Path)
    s.add_argument("adapted", type=Path)
    s.add_argument("--dataset", type=Path, default=Path("../shared/data/scifact"))
    s.add_argument("--split", default="train")
    s.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    original = Signals(**pickle.loads(args.signals.read_bytes()))
    if args.command == "train":
        model, run = train(
            original,
            args.pairs,
            negatives=args.negatives,
            epochs=args.epochs,
            rate=args.rate,
            batch=args.batch,
            seed=args.seed,
        )
        adapted, seconds = reencode(model, original)
        run["encode_seconds"] = round(seconds, 1)
        print(json.dumps(run), file=sys.stderr)
        args.out.write_bytes(pickle.dumps({**adapted.fields(), "run": run}))
        return 0
    stored = pickle.loads(args.adapted.read_bytes())
    run = stored.pop("run", {})
    report = {"run": run, **score(original, Signals(**stored), args.dataset, args.split)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
