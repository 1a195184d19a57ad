"""Retrieval building blocks shared by techniques: keyword queries and score fusion."""
