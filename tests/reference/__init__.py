"""The reference engine against Hugging Face transformers: every architecture, fp32 on the CPU, and on a GPU."""
