"""Technique name to pipeline class: a new technique is one module plus one line here."""

from __future__ import annotations

from iris_rag.pipelines.base import Pipeline
from iris_rag.pipelines.basic import BasicPipeline
from iris_rag.pipelines.colbert import ColbertPipeline
from iris_rag.pipelines.crag import CragPipeline
from iris_rag.pipelines.graphrag import GraphRagPipeline
from iris_rag.pipelines.hybrid_ifind import HybridIFindPipeline
from iris_rag.pipelines.hyde import HydePipeline
from iris_rag.pipelines.noderag import NodeRagPipeline
from iris_rag.pipelines.sqlrag import SqlRagPipeline

PIPELINES: dict[str, type[Pipeline]] = {
    BasicPipeline.technique: BasicPipeline,
    ColbertPipeline.technique: ColbertPipeline,
    CragPipeline.technique: CragPipeline,
    GraphRagPipeline.technique: GraphRagPipeline,
    HybridIFindPipeline.technique: HybridIFindPipeline,
    HydePipeline.technique: HydePipeline,
    NodeRagPipeline.technique: NodeRagPipeline,
    SqlRagPipeline.technique: SqlRagPipeline,
}
