"""The polyhedral middle end: checked program -> scop -> dependences -> schedule -> loop IR.

isl stays inside this package; its output, the loop IR (`polyhedral.loop_ir`), is plain
data. Import submodules directly: this package's `__init__` imports nothing, so backends
can use the loop IR without loading islpy.
"""
