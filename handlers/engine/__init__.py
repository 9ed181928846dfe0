"""The model as it serves: buckets, packing, layout, the runner, the decoder and its KV cache, sampling."""
