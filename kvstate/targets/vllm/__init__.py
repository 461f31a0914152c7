"""Fuzz targets for real engines' allocators (driven directly, no model, GPU or scheduler)."""
