"""Every Triton kernel of fast/kernels/ against a float64 torch reference (reference.py) on hypothesis-drawn
shapes: through the interpreter on the CPU, compiled on a GPU."""
