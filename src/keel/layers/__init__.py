"""Building blocks of keel's models: the paged-attention seam and its per-step metadata, linear variants
(keel's kernel, oneDNN-prepacked, FP8), rotary embedding, RMSNorm and the sampler.

Layers take plain tensors plus the step's `AttnMetadata`; they know nothing of requests, schedulers or
block managers (the engine imports layers and models, never the other way)."""
