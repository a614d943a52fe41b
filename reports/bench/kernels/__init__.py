"""Kernel micro-benchmarks: the fast engine's Triton kernels timed beside torch or cuBLAS, on one GPU.

- `kernel_bench.py`: `twinfer bench kernels`, every kernel against its ceiling (copy bandwidth or FLOP/s).
- `gemv.py`: the small-batch linear against cuBLAS at decode shapes, with a tile sweep.
- `decode_attention.py`: the split-KV decode kernel against packed GQA rows, per decode step.
- `decode_splits.py`: the decode kernel's cost against max_seq_len, and its grid sweep.
- `invariant_attention.py`: batch-invariant mode's attention tiles against the default paths.
- `invariant_matmul.py`: batch-invariant matmul configurations, bitwise invariance and speed.
- `kernel_reference.py`: torch references of the kernels, shared with the kernel tests (tests/fast/kernels/).
- `sm90_build.py`: a kernel's registers, stack and shared memory as built for sm_90, without a GPU.

Each runs as `python -m reports.bench.kernels.NAME` (`--help` for its options). Studies whose conclusion
was "not used" leave this package; their records in reports/results/ name the commit that has the code.
"""
