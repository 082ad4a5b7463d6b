"""aotkit_cache.entry."""
