"""Behaviour analytics over recorded rollouts: tool classes, SQL views, per-group metrics, run comparison, replay."""
