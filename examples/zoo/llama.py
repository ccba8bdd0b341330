"""A Llama-style decoder (``transformers.LlamaForCausalLM``) taking one decode step with a
KV cache: RoPE, RMSNorm, SDPA attention with grouped KV heads, SwiGLU MLP; 2 layers,
hidden size 32, random weights.

``make_model`` runs the prompt (7 tokens) eagerly to fill a ``DynamicCache``, and the
exported call is the next step: ``model(next_token, None, None, cache)`` (the fourth
parameter is ``cache``). dfit passes the cache through the export as its tensors
(``dfit_mlir.frontends.torch_caches``): the compiled ``main`` takes the token and the
keys of both layers, then their values (``1x2x7x8xf32`` each), and returns the logits
(``1x1x64``) and the grown keys and values (``1x2x8x8``), in that order.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, PROMPT = 64, 7


def make_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attn_implementation="sdpa", bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, VOCAB, (1, PROMPT)), use_cache=True).past_key_values
    return model, (torch.randint(0, VOCAB, (1, 1)), None, None, cache)
