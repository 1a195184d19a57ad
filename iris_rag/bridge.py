"""`python -m iris_rag.bridge`: the worker process the MCP front end spawns."""

from iris_rag.worker.server import main

if __name__ == "__main__":
    main()
