"""Generators of the docs' pages that are rendered from files, never typed (`python -m docs.generate.results`)."""
