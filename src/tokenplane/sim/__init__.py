"""The digital twin: a deterministic discrete-event simulator of a GPU fleet on the shared core."""
