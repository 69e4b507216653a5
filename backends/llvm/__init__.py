"""CPU backend: loop IR -> LLVM IR (llvmlite), JIT-compiled."""
