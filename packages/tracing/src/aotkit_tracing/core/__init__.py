"""aotkit_tracing.core."""
