"""kvstate.kernels."""
