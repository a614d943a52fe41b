"""The OpenAI-compatible server: its endpoints, the official client as its users write code, throughput and
failure handling (skipped with the reason where the server's packages are absent)."""
