"""Configuration every room reads: model-config.yaml's `handler:` section, checked; where a worker sits."""
