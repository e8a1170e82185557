"""Synthetic extreme-classification data and converters for real formats."""
