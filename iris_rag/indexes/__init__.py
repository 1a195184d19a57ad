"""Technique indexes: data a technique builds from documents at ingest (token vectors, node trees, graphs)."""
