"""Local models: the tiny built-in model, SmolLM2 from its pip package, and name resolution."""
