"""kvstate.model."""
