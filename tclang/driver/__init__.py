"""The driver wing: the compile door (`compiler.compile_kernel`), its cache key, the memory
and disk caches, call records, the backend registry, the middle end's helper process and
the schedule summary. It imports the ground values, tclang.lang, polyhedral and (through
the registry) backends; never the runtime, export or tools wings (docs/architecture.md)."""
