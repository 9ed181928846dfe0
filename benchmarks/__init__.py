"""Benchmarks, load tests, the soak run and the traffic they share, with their baseline handlers."""
