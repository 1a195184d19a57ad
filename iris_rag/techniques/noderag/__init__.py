"""NodeRAG: the heterogeneous node tree index and the pipeline that searches it."""
