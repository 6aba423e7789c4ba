"""EARL core: agentic RL of LLMs on multi-turn Connect Four (library; no Django, no Celery)."""

from __future__ import annotations

__version__ = "0.1.0"
