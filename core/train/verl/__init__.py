"""forgetui on veRL (GPU clusters): an agent loop that runs real sandbox rollouts, and the `forgetui train --trainer verl` launcher.

Nothing here imports veRL at package import: `core.train.verl.agent_loop` (the registered loop) does,
and veRL only loads it in its agent-loop workers.
"""
