"""Compiling: torch.compile as a worker runs it, the compile caches, and AOT packages."""
