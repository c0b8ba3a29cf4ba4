"""envs."""
