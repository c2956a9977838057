"""OpenAI-compatible HTTP API: one folder per endpoint (api_router / protocol / serving), shared parts here."""
