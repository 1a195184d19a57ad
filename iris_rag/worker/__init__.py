"""The Python worker: one long-lived process serving JSON-lines requests from the MCP front end."""
