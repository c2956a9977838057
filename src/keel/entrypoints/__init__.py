"""Network entry points of keel (today: the OpenAI-compatible server of `keel serve`)."""
