"""Code generators: loop IR -> LLVM (CPU), CUDA C (GPU), and the NumPy reference
interpreter. Each imports only the loop IR (and dtypes); PyCUDA is imported lazily."""
