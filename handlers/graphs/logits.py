"""A transformers `...For<Task>` model as the graph a classifier compiles: its logits, per text or per
token, packed rows included."""

import torch

from ts_compiled_handlers.engine.packing import attention_inputs, pick_per_text, starts_of_texts


class Logits(torch.nn.Module):
    """A HF `...For<Task>` model reduced to its logits tensor, the shape torch.compile sees."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids=None) -> torch.Tensor:
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}  # (B, T): text pairs
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **types).logits


class TokenLogits(Logits):
    """A token classifier: per-token logits, packed rows included."""

    per_token = True

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        """Per-token logits (rows, T, labels) under a 4-D mask (packed rows)."""
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.model, segments),
        ).logits


class SequenceLogits(Logits):
    """A sequence classifier: `forward` as `Logits`; over packed rows its head runs on each text's
    first token, picked inside the graph, so a packed row answers for each of its texts."""

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        base, classifier = self.model.base_model, getattr(self.model, "classifier", None)
        pooler = getattr(base, "pooler", None)
        bert_like = (
            hasattr(pooler, "dense") and hasattr(pooler, "activation") and isinstance(classifier, torch.nn.Linear)
        )
        roberta_like = pooler is None and hasattr(classifier, "out_proj")  # its head reads token 0 itself
        if not (bert_like or roberta_like):  # DistilBERT, ALBERT, DeBERTa...: heads with other steps
            raise NotImplementedError(f"{type(self.model).__name__}'s head is neither BERT- nor RoBERTa-like")
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = base(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(base, segments),
            **types,
        )[0]
        firsts = pick_per_text(hidden, segments, starts_of_texts(segments))  # (rows, slots, H)
        rows, slots, width = firsts.shape
        firsts = firsts.reshape(rows * slots, 1, width)  # heads read token 0 of each (text, 1, H)
        if bert_like:  # the pooler (dense + tanh of token 0), then the classifier
            firsts = pooler(firsts)
        return classifier(firsts).reshape(rows, slots, -1)
