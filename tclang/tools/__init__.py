"""The CLI's commands and the tools beside them: checks against NumPy or the reference
interpreter, sampled checks, random inputs, timing. Above the runtime and the driver."""
