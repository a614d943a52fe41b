"""Models twinfer ships and the tools that make them.

- `stdlib-tiny/` (data, not a package): the built-in default model and its model card
  (`twinfer.default_model` finds it).
- `train_tiny.py`: trains stdlib-tiny on the Python standard library (`twinfer train-tiny`).
- `eval_tiny.py`: its acceptance figures, measured with the reference engine.
- `tiny_model.py`: random tiny checkpoints of every supported architecture, deterministic for a seed
  (`twinfer tiny-model`; the tests' and the server's checkpoints).

Nothing here imports `reports`: these tools sit in the layer users install.
"""
