"""aotkit"""
