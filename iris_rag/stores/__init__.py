"""Stores: where collections, documents, chunks, vectors and call records live."""
