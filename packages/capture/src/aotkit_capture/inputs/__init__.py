"""aotkit_capture.inputs."""
