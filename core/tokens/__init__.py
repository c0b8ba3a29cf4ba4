"""The token path: chat templates, tool-call parsing and token-exact continuation."""
