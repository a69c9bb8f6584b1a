"""Recipes that train the reward models offline: a contrastive CLIP, SPECS specificity fine-tuning
(detail units, triplets, the specificity rate) and L-CLIP distillation."""
