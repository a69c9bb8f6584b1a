"""rlcap features: images -> HDF5 grid/pooled features and reward-model image embeddings."""
