"""aotkit_tracing.inputs."""
