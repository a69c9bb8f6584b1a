"""CLIP-family model code: open_clip architectures (rlcap's world CLIP joins open_clip's registry),
LongCLIP/SPECS `spec.pt` checkpoints, the L-CLIP student of DistillCLIP checkpoints, unpadded
CLIP tokenisation, safe weight loading and the one reward-model factory (`factory`).

Nothing heavy is imported here: configs import `spec` without loading open_clip.
"""
