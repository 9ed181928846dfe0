"""What the compiled graph computes past the encoder: pooling, sentence-transformers' heads, SPLADE,
ColBERT, bge-m3's heads, classifiers' logits, an LLM reranker's score, an image-text model's towers,
as `nn.Module`s, with the model files that configure them. The tasks (handlers/tasks/) build them
and read their outputs; nothing here knows of requests or servers."""
