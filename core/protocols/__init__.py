"""Wire protocols: OpenAI chat, OpenAI responses, Anthropic messages, Gemini."""
