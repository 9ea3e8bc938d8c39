"""Adapters at the edge: they touch the world so the core does not."""
