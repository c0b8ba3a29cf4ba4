"""Scoring many rollouts: pass@k and pass^k, eval reports per env × harness × model, run summaries."""
