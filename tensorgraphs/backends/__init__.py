"""Backends execute graphs. `numpy` is the reference interpreter every other backend is tested against."""
