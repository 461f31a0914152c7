"""kvstate.impl."""
