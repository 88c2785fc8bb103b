"""`pdserve bench`: load generation and measurement against any OpenAI-compatible server."""
