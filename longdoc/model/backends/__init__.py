"""The attention's backends: ways to compute one softmax of global-local attention, behind one call.

As etcmodel chooses its attention's implementation by name (`att_implementation`), the encoder
computes each softmax with a backend chosen once per forward pass from the device, the dtype and
a name: `config.attention_backend` (saved with the model), which `set_attention_backend` overrides at
run time and the commands' `--attention` set.
- eager: blocked PyTorch ops, the specification (longdoc.model.backends.eager);
- cpu: the compiled C++ kernels, CPU float32 (longdoc.model.backends.cpu);
- gpu: the fused Triton kernels, CUDA (CPU tensors in its interpreter mode, TRITON_INTERPRET=1:
  longdoc.model.backends.gpu);
- dense: a float64 reference over full rows, slow (longdoc.model.backends.dense);
- auto: cpu on the CPU in float32 and bfloat16 where the kernels build (unless LONGDOC_KERNELS=0), gpu on CUDA
  in bfloat16, float16 or float32 where Triton imports, else eager; under torch.compile the cpu
  kernels too (torch operators, longdoc::cpu_softmax and its backward, which the compiled graph
  calls), eager on other devices (the GPU kernels do not trace) and while export traces the model.
A backend named where it cannot run is refused (`AttentionBackendError`, one line naming the
backend, the device, the dtype and what runs there). The interface: longdoc.model.backends.base;
the choice: longdoc.model.backends.resolution. This module imports nothing (the command line reads
the names for its --help).
"""

AUTO = "auto"
BACKEND_NAMES = (AUTO, "eager", "cpu", "gpu", "dense")


class AttentionBackendError(ValueError):
    """An attention backend asked for where it cannot run, or one of no such name."""
