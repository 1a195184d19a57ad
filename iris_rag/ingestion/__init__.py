"""Ingestion: reading source files and cutting documents into chunks."""
