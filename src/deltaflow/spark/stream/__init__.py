"""Delta streams: the stream source, the stream sink, and per-batch progress."""
