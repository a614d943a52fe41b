"""The spec's rules, and both engines held to them: sampling, block hashes, invariants, model configs,
checkpoint loading, bad input, prompt logprobs, the prefix cache, batch invariance (tests parametrized over
tests.engines.ENGINE_NAMES run the same assertions on every engine)."""
