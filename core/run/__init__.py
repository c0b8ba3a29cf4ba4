"""A run from its config: an eval, or a trainer found in the trainers' registry; replaying a recorded rollout."""

from core.run.execute import execute_run

__all__ = ["execute_run"]
