"""rag_generate_podcast: a two-voice script grounded in retrieved passages, spoken offline to a WAV file."""
