"""The attention's compiled kernels, one folder per device: `cpu` (C++, built on first use with
torch's C++ extension tools) and `gpu` (Triton). The backends in longdoc.model.backends call them."""
