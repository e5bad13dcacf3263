"""The engine: how the model runs under SITE's gate, below the stages (which generate and score through it).

backend         the last-token seam: the reference path or packed weights, chosen once per model
hooked_backend  the reference: the HookedTransformer against a frozen TransformerLens KV cache
bridge_backend  the TransformerBridge's side of the seam (Hugging Face KV cache)
packed          the packed model: one forward for the last token(s) against cached keys/values
packed_layer    the packed weights (PackedWeights, one PackedLayer per block), and what a HookedTransformer must be to pack
hooked_pack     packed weights read from a HookedTransformer (PackedWeights), and decoding from its KV cache
bridge_pack     packed weights read from a TransformerBridge
kernels         C++ kernels for the packed path (csrc/), compiled on first use
prefix          prompt prefixes' keys and values, and decode caches
prompt_cache    many prompts against their cached prefixes
probe           the one probe: a faster path held to its reference on a seeded prompt before use
"""
