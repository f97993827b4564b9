"""``deep_ep.buffers`` of DeepEP 2.5.0 (its ``__init__`` exports nothing, as the library's)."""
