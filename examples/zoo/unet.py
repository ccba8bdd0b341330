"""A small UNet: two downsampling stages (conv + GroupNorm + SiLU, strided conv), a
bottleneck, two upsampling stages (nearest upsample + conv) with skip connections."""

import torch
from torch import nn


class ConvBlock(nn.Module):
    def __init__(self, channels_in, channels_out):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.norm = nn.GroupNorm(2, channels_out)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


class Down(nn.Module):
    def __init__(self, channels_in, channels_out):
        super().__init__()
        self.block = ConvBlock(channels_in, channels_out)
        self.pool = nn.Conv2d(channels_out, channels_out, 3, stride=2, padding=1)

    def forward(self, x):
        skip = self.block(x)
        return self.pool(skip), skip


class Up(nn.Module):
    def __init__(self, channels_in, channels_skip, channels_out):
        super().__init__()
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.block = ConvBlock(channels_in + channels_skip, channels_out)

    def forward(self, x, skip):
        return self.block(torch.cat([self.upsample(x), skip], dim=1))


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down1 = Down(3, 8)
        self.down2 = Down(8, 16)
        self.mid = ConvBlock(16, 16)
        self.up2 = Up(16, 16, 8)
        self.up1 = Up(8, 8, 8)
        self.head = nn.Conv2d(8, 3, 1)

    def forward(self, x):
        x, skip1 = self.down1(x)
        x, skip2 = self.down2(x)
        x = self.mid(x)
        x = self.up2(x, skip2)
        x = self.up1(x, skip1)
        return self.head(x)


def make_model():
    torch.manual_seed(0)
    return UNet().eval(), (torch.randn(1, 3, 16, 16),)
