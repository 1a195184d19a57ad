"""Pipelines: one module per RAG technique, all filling the template in base.py."""
