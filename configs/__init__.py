"""Experiment configs: Python files with `get_config(arg=None)`; each docstring holds its command.

base.py defines every field with its default; the others override some (`fxformer.config.with_overrides`).
"""
