"""The entry points of a built kernel library, loaded with ctypes: the plain-CUDA side of the op."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from ..spec.config import MAX_EPILOGUE_OPERANDS

#: What the library's path chooser answers (GemmPath of templates/common/gemm_args.h): the kernel a call takes;
#: for a grouped call (group_ends), the kernel walking the groups or none (the launch would refuse the call).
PATHS = {0: "fast", 1: "unaligned", 2: "small_m", 3: "repacked", 4: "grouped", -1: "none"}


#: GEMMGEN_MAX_EPILOGUE_OPERANDS of templates/common/gemm_args.h.
EPILOGUE_SLOTS = MAX_EPILOGUE_OPERANDS


class GemmListProblemStruct(ctypes.Structure):
    """Mirror of GemmListProblem (templates/common/gemm_args.h): one problem of a list-form grouped call."""

    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64), ("ldd", ctypes.c_int64)]


class GemmArgsStruct(ctypes.Structure):
    """Mirror of templates/common/gemm_args.h."""

    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64), ("ldd", ctypes.c_int64),
                ("ep_ptr", ctypes.c_void_p * EPILOGUE_SLOTS), ("ep_ld", ctypes.c_int64 * EPILOGUE_SLOTS),
                ("ep_scalar", ctypes.c_float * EPILOGUE_SLOTS), ("aux", ctypes.c_void_p), ("ldaux", ctypes.c_int64),
                ("batch", ctypes.c_int64), ("batch_stride_a", ctypes.c_int64), ("batch_stride_b", ctypes.c_int64),
                ("batch_stride_d", ctypes.c_int64),
                ("group_ends", ctypes.c_void_p), ("group_rows", ctypes.c_int64),
                ("list", ctypes.POINTER(GemmListProblemStruct)), ("list_device", ctypes.c_void_p),
                ("groups_along_k", ctypes.c_int64), ("amax", ctypes.c_void_p)]


@dataclass(frozen=True)
class KernelLibrary:
    """The entry points of one built kernel library."""

    path: Path
    launch: ctypes._CFuncPtr
    choose_path: ctypes._CFuncPtr
    error_string: ctypes._CFuncPtr

    @classmethod
    def load(cls, path: Path, name: str) -> KernelLibrary:
        lib = ctypes.CDLL(str(path))
        launch = lib[f"{name}_launch"]
        launch.argtypes, launch.restype = [ctypes.POINTER(GemmArgsStruct), ctypes.c_void_p], ctypes.c_int
        choose_path = lib[f"{name}_path"]
        choose_path.argtypes, choose_path.restype = [ctypes.POINTER(GemmArgsStruct)], ctypes.c_int
        error_string = lib[f"{name}_error_string"]
        error_string.argtypes, error_string.restype = [ctypes.c_int], ctypes.c_char_p
        return cls(path, launch, choose_path, error_string)
