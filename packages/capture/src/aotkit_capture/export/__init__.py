"""aotkit_capture.export."""
