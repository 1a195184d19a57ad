"""Technique name to pipeline class: a new technique is one module plus one line here."""

from __future__ import annotations

from iris_rag.pipelines.base import Pipeline
from iris_rag.pipelines.basic import BasicPipeline
from iris_rag.pipelines.hybrid_ifind import HybridIFindPipeline

PIPELINES: dict[str, type[Pipeline]] = {
    BasicPipeline.technique: BasicPipeline,
    HybridIFindPipeline.technique: HybridIFindPipeline,
}
