"""Structured data for rag_sqlrag: tables with inferred column types, a read-only SQL guard, table schemas."""
