"""aotkit_frontends.module_state."""
