"""Diagnostics: pure parsers that turn a node's tool output into a health verdict."""
