"""Models: the embedding model and the answer generators."""
