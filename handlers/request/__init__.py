"""One request: what a client sent, checked, tokenized, and what it comes to (its result or its error)."""
