"""Code more than one store backend uses (kept apart from backends/__init__, which picks a backend)."""
