"""A run session: one run's store, policy, proxy, runtime and images, and the setup that builds them."""

from core.session.run_session import RunSession, rollout_id_for, store_rows

__all__ = ["RunSession", "rollout_id_for", "store_rows"]
