"""forgetui tests (a regular package: veRL ships a top-level `tests` package that would shadow a namespace one)."""
