"""The kernel: what every app and the root may import. It imports no app and nothing of
the root (tests/test_shape.py walks the imports and says so when one does)."""
