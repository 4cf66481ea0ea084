"""The OpenAI-compatible gateway under `/v1/` (architecture.md, Hot paths).

A plain ASGI app in front of Django: keys, models and ready replicas come from
in-memory tables (`tables`) that a background task refreshes when the
database says they changed; limits (`limits`), usage (`usage`), load for the
autoscaler (`load`) and metrics (`metrics`) are counted in memory and written
in batches. A request costs no database query.
"""
