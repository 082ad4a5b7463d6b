"""aotkit_tracing.autocast."""
