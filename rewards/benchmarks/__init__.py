"""Benchmarks behind `python -m rewards.bench`: n-gram metrics against pycocoevalcap, the batched
CLIP-family scorer against a naive one, and an L-CLIP student against its teacher."""
