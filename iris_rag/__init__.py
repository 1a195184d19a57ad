"""iris-rag: retrieval-augmented answers over a document collection, served to MCP clients."""

__version__ = "0.1.0"
