"""The eight techniques: the pipeline template (base.py), a module or folder each, and the registry."""
