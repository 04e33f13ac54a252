"""Multi-head latent attention decode over a paged latent cache (torch reference).

The cache is [num_blocks, block_size, kv_lora_rank + rope]: per position the normed KV
latent and the rotated shared key, one entry for all heads. The query arrives absorbed: its
no-rope part already multiplied through the key half of kv_b_proj, so it lives in the latent
space ([B, H, kv_lora_rank]); its rope part [B, H, rope] meets the shared key. The latent is
both key (with the rope part) and value; the output stays in the latent space [B, H,
kv_lora_rank], for the caller to project through the value half of kv_b_proj.
"""

import torch


def mla_decode_torch(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query row per sequence over its first context_lens latents: [B, H, kv_lora_rank]."""
    rank = q_latent.shape[-1]
    gathered = cache[block_tables].flatten(1, 2)  # [B, width * block_size, rank + rope]
    latent, k_pe = gathered.split([rank, gathered.shape[-1] - rank], dim=-1)
    scores = torch.einsum("bhl,bsl->bhs", q_latent, latent)
    scores = (scores + torch.einsum("bhr,bsr->bhs", q_pe, k_pe)).float() * scale
    past = torch.arange(gathered.shape[1], device=cache.device) >= context_lens[:, None]
    # finite, so that a padding row (context 0, in decode graphs) stays finite
    scores = scores.masked_fill(past[:, None, :], torch.finfo(torch.float32).min)
    probs = scores.softmax(dim=-1).to(latent.dtype)
    return torch.einsum("bhs,bsl->bhl", probs, latent)
