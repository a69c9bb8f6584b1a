"""rlcap features: images -> HDF5 grid/pooled features and reward-model image embeddings.

Sub-packages on lower floors: `features.world` (the offline world, with its foils) and
`features.clip_models` (the CLIP-family model code). Nothing is imported here, so that a lower
floor never loads a higher one.
"""
