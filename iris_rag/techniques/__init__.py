"""The eight techniques, a module or a folder each (pipeline, index, storage contract), and the registry."""
