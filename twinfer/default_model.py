"""The built-in default model: stdlib-tiny, trained on the Python standard library and shipped in the
package (twinfer/models/stdlib-tiny, with its model card). The CLI, the report and the differential
tests use it when no model is named; the random tiny models (twinfer.models.tiny_model) cover the shapes."""

from __future__ import annotations

from pathlib import Path

from spec.errors import CheckpointError

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "models" / "stdlib-tiny"


def default_model() -> Path:
    """The shipped checkpoint's directory; CheckpointError if the installation lacks it."""
    if not (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
        raise CheckpointError(
            f"the built-in model is missing from {DEFAULT_MODEL_DIR} (a broken installation?); pass --model"
        )
    return DEFAULT_MODEL_DIR
