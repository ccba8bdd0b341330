"""A Vision Transformer (``transformers.ViTModel``) from a tiny config, random weights:
2 layers, hidden size 32, 16x16 images in 4x4 patches."""

import torch
from transformers import ViTConfig, ViTModel


def make_model():
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64)
    return ViTModel(config, add_pooling_layer=False).eval(), (torch.randn(1, 3, 16, 16),)
