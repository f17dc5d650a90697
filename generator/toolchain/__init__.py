"""The build stage: rendered sources -> a loaded-ready shared library, with nvcc driven by ninja (parallel,
incremental), cached by the hash of everything that changes the binary, under a lock per cache entry.
It decides nothing about kernels: it compiles what it is given.
"""
from .builder import (BuildError, BuildProgress, BuildRequest, BuildResult, build, build_many, cache_key, cache_root,
                      file_lock, ninja_path, nvcc_flags, nvcc_path, nvcc_version, spill_report, write_atomically)

__all__ = ["BuildError", "BuildProgress", "BuildRequest", "BuildResult", "build", "build_many", "cache_key",
           "cache_root", "file_lock", "ninja_path", "nvcc_flags", "nvcc_path", "nvcc_version", "spill_report",
           "write_atomically"]
