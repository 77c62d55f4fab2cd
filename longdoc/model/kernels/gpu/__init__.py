"""The fused GPU attention: one softmax of the global-local attention in Triton kernels, forward and
backward (`TritonSoftmax`, a drop-in for longdoc.model.attention.CompiledSoftmax).
"""

from longdoc.model.kernels.gpu.softmax import TritonSoftmax, triton_available

__all__ = ["TritonSoftmax", "triton_available"]
