"""twinfer's public entry point: `from twinfer import LLM, SamplingParams`."""
