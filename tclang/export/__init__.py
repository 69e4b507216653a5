"""The export wing: a compiled kernel as a shared library with a C header (CPU) or as CUDA
source (library.py, abi.py, cuda.py, c_text.py); it compiles through the driver's door."""
