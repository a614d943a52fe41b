"""The test suite, grouped like the code: spec/ (the rules both engines obey, held on both), reference/,
fast/ (with kernels/), server/, reports/ and twinfer/; test_imports.py holds every package to the layer
direction. Shared here: conftest.py (the tiny checkpoint), engines.py (engines by name, the fast one on the
GPU where there is one), gpu_checks.py and server_packages.py. The fuzzers live in ../fuzz/."""
