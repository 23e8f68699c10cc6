"""dos: Deep Optimizer States.

PyTorch-exact Adam/AdamW whose optimizer state lives in host memory, updated by a
C++ engine at the memory-bandwidth limit, optionally interleaved with a device.

    import dos.torch
    opt = dos.torch.AdamW(model.parameters(), lr=3e-4)   # was torch.optim.AdamW

The extension (``dos._core``) takes raw tensor views and links no framework, so one
build serves every torch from 1.13 on; ``dos.torch`` is the torch layer over it.
"""

from . import _core

__version__ = "0.1.0"
#: Whether this build has the CUDA backend (``backend="cuda"``).
has_cuda = bool(_core.has_cuda)

__all__ = ["has_cuda", "torch", "__version__"]


def __getattr__(name):
    # `import dos` must not import torch (it is only needed by dos.torch), yet
    # `dos.torch.AdamW` after a plain `import dos` should work: import it on first use.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'dos' has no attribute {name!r}")
