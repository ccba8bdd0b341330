"""BERT (``transformers.BertModel``) from a tiny config, random weights: 2 layers, hidden
size 32, called with token ids only."""

import torch
from transformers import BertConfig, BertModel

VOCAB, SEQ = 64, 8


def make_model():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    return BertModel(config).eval(), (torch.randint(0, VOCAB, (1, SEQ)),)
