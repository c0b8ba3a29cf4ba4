"""Rollouts: the status machine, one rollout's attempt in a sandbox, and the engine that runs many."""
