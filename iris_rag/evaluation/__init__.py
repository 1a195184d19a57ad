"""Retrieval evaluation: BEIR datasets, every technique's real retrieval path, trec_eval's measures."""
