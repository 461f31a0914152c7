"""kvstate.numerics."""
