"""The router: OpenAI-compatible ingress, request validation and the prefill→decode flow."""
