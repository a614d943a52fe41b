"""The reference engine: small, plain PyTorch, obviously correct. The executable specification."""

from reference.engine import ReferenceEngine
from reference.llm import LLM

__all__ = ["LLM", "ReferenceEngine"]
