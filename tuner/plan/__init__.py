"""Before launching: vLLM's own config validation of a candidate, and GPU estimates."""
