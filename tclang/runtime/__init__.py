"""The runtime wing: `Module`/`Kernel`/`CompiledKernel` (kernels.py), argument checks,
host tensors and the hot call paths. It compiles through the driver's one door and imports
no polyhedral module (docs/architecture.md)."""
