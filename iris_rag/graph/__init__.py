"""Knowledge-graph building blocks: entity and relation extraction (rules or an LLM)."""
