"""Policy backends: builtin (transformers), scripted, vllm (HTTP) and litellm passthrough."""
