"""Technique name to pipeline class: a new technique is one module plus one line here."""

from __future__ import annotations

from iris_rag.pipeline import Pipeline
from iris_rag.techniques.basic import BasicPipeline
from iris_rag.techniques.colbert.pipeline import ColbertPipeline
from iris_rag.techniques.crag import CragPipeline
from iris_rag.techniques.graphrag.pipeline import GraphRagPipeline
from iris_rag.techniques.hybrid_ifind import HybridIFindPipeline
from iris_rag.techniques.hyde import HydePipeline
from iris_rag.techniques.noderag.pipeline import NodeRagPipeline
from iris_rag.techniques.sqlrag.pipeline import SqlRagPipeline

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
