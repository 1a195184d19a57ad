"""ColBERT: token-level late interaction (index.py keeps the token vectors; pipeline.py reranks)."""
