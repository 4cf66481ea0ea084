"""``llmgw ctl`` against a fake control plane (httpx.MockTransport): no database, no network."""
