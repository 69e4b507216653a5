"""CPU emulation of CUDA's thread model: the generated CUDA C compiled as C++ by g++.

tclang_cuda_emulation.h (force-included before the kernel source) provides CUDA's qualifiers,
built-in variables, __syncthreads() and warp barriers over cooperative fibers run in thread
order, atomics, the device math functions and __half; build.py compiles, caches and loads
the result (compile_emulated, available, EmulationBuildError).
"""
