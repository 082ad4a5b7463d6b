"""aotkit_capture.compile."""
