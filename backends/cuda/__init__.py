"""CUDA backend: GPU-mapped loop IR -> CUDA C, run through PyCUDA or the CPU emulation."""
