"""The loops that serve requests: request batches, generation batches, scheduled requests, the decode
loop, the model thread."""
