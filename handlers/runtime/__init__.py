"""The process: hardware, torch settings, live workers, the allocator, JSON, metric names, package files."""
