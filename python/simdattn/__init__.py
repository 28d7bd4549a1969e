"""simdattn: SIMD-optimized CPU attention for transformer inference.

attention(), attention_paged() and linear_attention() read and write NumPy arrays and any
object with __dlpack__ (torch tensors, float32/float64/float16/bfloat16) in place through
their strides; outputs come back as the inputs' kind. MultiHeadAttention is
torch.nn.MultiheadAttention's layer (batch_first) with KvCache and KvPool for decoding.
simdattn.torch (imported on demand; needs PyTorch) has drop-ins for torch's
scaled_dot_product_attention and nn.MultiheadAttention. Every call releases the GIL while it
computes; invalid input raises simdattn.Error (a ValueError) whose .argument names the
argument at fault.
"""
from ._simdattn import *  # noqa: F401,F403  (the compiled functions and classes)
from ._simdattn import Error, __version__, _array_view, _time_attention_cpp  # noqa: F401

import enum as _enum


class ThreadRuntime(str, _enum.Enum):
    """C++'s ThreadRuntime for set_thread_runtime: each member equals its name as a string, which
    set_thread_runtime takes too and thread_runtime() returns."""
    team = "team"
    openmp = "openmp"
