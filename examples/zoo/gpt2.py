"""GPT-2 (``transformers.GPT2LMHeadModel``) from a tiny config, random weights: 2 layers,
hidden size 32, called with token ids only."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, SEQ = 64, 8


def make_model():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0, use_cache=False)
    return GPT2LMHeadModel(config).eval(), (torch.randint(0, VOCAB, (1, SEQ)),)
