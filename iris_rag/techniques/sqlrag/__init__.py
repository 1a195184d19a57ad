"""SQL RAG: structured tables, the read-only SQL guard, and the question-to-SQL pipeline."""
