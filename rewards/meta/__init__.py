"""Metric meta-evaluation: foil accuracy, pairwise preference accuracy and correlation with human
ratings (Kendall tau_b / tau_c, Pearson)."""
