"""A module whose weights are shared: one ``Linear`` applied at every step of an
unrolled recurrence, and an output head tied to the input embedding."""

import torch
from torch import nn


class SharedRecurrence(nn.Module):
    def __init__(self, vocab=32, hidden=16, steps=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.steps = steps

    def forward(self, ids):
        h = self.embed(ids)
        for _ in range(self.steps):
            h = self.norm(h + torch.tanh(self.cell(h)))
        return h @ self.embed.weight.T  # the head shares the embedding table


def make_model():
    torch.manual_seed(0)
    return SharedRecurrence().eval(), (torch.randint(0, 32, (1, 6)),)
