"""A Llama-style decoder (``transformers.LlamaForCausalLM``): RoPE, RMSNorm, SDPA
attention with grouped KV heads, SwiGLU MLP; 2 layers, hidden size 32, random weights,
called with token ids only."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SEQ = 64, 8


def make_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attn_implementation="sdpa", bos_token_id=0, eos_token_id=0, pad_token_id=0,
                         use_cache=False)
    return LlamaForCausalLM(config).eval(), (torch.randint(0, VOCAB, (1, SEQ)),)
