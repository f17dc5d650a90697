"""The runtime stage: a built kernel library behind a torch op (``op.GemmOp``), with its argument checks
(``op_checks``, on ``checks``), its torch.library registration (``registration``), its ctypes entry points
(``library``), the build-and-load step (``loader``), the C++ call path (``jit_runtime``) and the autograd formula
(``autograd``; that of grouped calls in ``grouped_formula``, which imports nothing of gemmgen because emitted packages
carry a copy of it), and the ops' DTensor sharding rules (``sharding``: tensor parallelism). Needs torch."""
from .buckets import BucketedOp, MBucket
from .checks import leading_dim
from .library import GemmArgsStruct, KernelLibrary
from .loader import build_request, load_library
from .op import GemmOp, compile_many, compile_op, registered_op

__all__ = ["BucketedOp", "GemmArgsStruct", "GemmOp", "KernelLibrary", "MBucket", "build_request", "compile_many",
           "compile_op", "leading_dim", "load_library", "registered_op"]
