"""ResNet (``transformers.ResNetModel``) from a tiny config, random weights: a BatchNorm
CNN with two stages of basic residual blocks."""

import torch
from transformers import ResNetConfig, ResNetModel


def make_model():
    torch.manual_seed(0)
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    return ResNetModel(config).eval(), (torch.randn(1, 3, 32, 32),)
