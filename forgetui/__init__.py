"""forgetui."""
