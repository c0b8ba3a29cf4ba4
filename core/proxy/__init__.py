"""The recording proxy: serves a harness's model calls in its own protocol and records them."""
