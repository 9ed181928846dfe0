"""TorchServe handlers that serve HuggingFace transformer models compiled, bucketed and warmed."""
