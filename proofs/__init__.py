"""kvstate.proofs."""
