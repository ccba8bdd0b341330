"""MobileNetV2 (``transformers.MobileNetV2Model``) from a tiny config, random weights:
inverted residual blocks of depthwise convolutions with BatchNorm and ReLU6."""

import torch
from transformers import MobileNetV2Config, MobileNetV2Model


def make_model():
    torch.manual_seed(0)
    config = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25, min_depth=4)
    return MobileNetV2Model(config).eval(), (torch.randn(1, 3, 32, 32),)
