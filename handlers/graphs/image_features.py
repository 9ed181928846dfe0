"""The two towers of an image-text model (CLIP, SigLIP) as the graphs that compile: texts to their
projected features, images to theirs."""

import torch


class TextFeatures(torch.nn.Module):
    """The text tower and its projection (SigLIP's is inside its tower, as its head):
    forward(input_ids, attention_mask) -> (batch, dim). `reads_padding` (SigLIP): the mask is not
    passed, as SigLIP's tokenizer gives none and its last token, a padding one, is pooled."""

    def __init__(self, model: torch.nn.Module, reads_padding: bool = False):
        super().__init__()
        self.text_model = model.text_model
        self.text_projection = getattr(model, "text_projection", torch.nn.Identity())
        self.reads_padding = reads_padding

    def forward(self, input_ids, attention_mask):
        mask = None if self.reads_padding else attention_mask
        return self.text_projection(self.text_model(input_ids=input_ids, attention_mask=mask).pooler_output)


class ImageFeatures(torch.nn.Module):
    """The vision tower and its projection (SigLIP's: its attention-pooling head, inside the tower):
    forward(pixel_values) -> (batch, dim)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.vision_model = model.vision_model
        self.visual_projection = getattr(model, "visual_projection", torch.nn.Identity())

    def forward(self, pixel_values):
        return self.visual_projection(self.vision_model(pixel_values=pixel_values).pooler_output)
