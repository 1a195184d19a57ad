"""GraphRAG: entity and relation extraction, the knowledge-graph index, and the graph-guided pipeline."""
