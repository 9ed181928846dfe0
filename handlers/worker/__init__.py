"""The worker: one model served, built once per process, and what it says about itself."""
