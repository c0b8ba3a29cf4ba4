"""Training: recorded calls → samples → advantages → policy updates (local trainer, SFT, veRL).

veRL and peft are imported where they are used, so `forgetui eval` never pays for them.
"""
