"""aotkit_cache.key."""
