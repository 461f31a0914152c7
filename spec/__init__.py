"""kvstate.spec."""
