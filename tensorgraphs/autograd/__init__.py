"""Reverse-mode differentiation on the graph, ahead of time: a backward pass is itself a graph."""
