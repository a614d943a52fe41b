"""What serving costs: the OpenAI server under load, its own overhead, the engine's host path, memory.

- `server_load.py`: `twinfer serve` under N concurrent streaming clients, against offline generate (GPU).
- `server_overhead.py`: the server's own cost per streamed token, with a stub engine (no GPU).
- `host_overhead.py`: the fast engine's host (Python) time per step, device work stubbed (CPU).
- `memory_check.py`: `twinfer memory-check`, the KV pool's share of GPU memory and repeated runs
  checked for leaks.

Each runs as `python -m reports.serving.NAME` (`--help` for its options).
"""
