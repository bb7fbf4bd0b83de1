"""Runnable examples (`python -m tensorgraphs.examples.<name>`)."""
