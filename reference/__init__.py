"""The reference engine: small, plain PyTorch, obviously correct. The executable specification."""

from reference.engine import ReferenceEngine

__all__ = ["ReferenceEngine"]
