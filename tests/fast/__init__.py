"""The fast engine: against the reference and transformers, its scheduler, input batch, CUDA graphs, async
scheduling, tensor parallelism, the GPU checks at the real shapes; its Triton kernels under kernels/."""
