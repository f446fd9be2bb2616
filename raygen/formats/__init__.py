"""The record and text formats every layer shares (see README.md): the trajectory record, reasoning, ShareGPT,
length limits, secret scrubbing, prompts; nothing here imports another raygen package but ``errors``."""
