"""The spec stage: what a kernel is, independent of how it is planned, rendered or run. Element types and
layouts (``types``), architecture facts (``arch``), ``KernelConfig`` with its legality rules (``config``) and
its account in words for ``print(plan)`` (``describe``), the epilogue description (``epilogue``). Imports nothing else of this package, and never torch."""
