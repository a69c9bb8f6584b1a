"""Reference-based text metrics at pycocoevalcap parity: BLEU, ROUGE-L, CIDEr, CIDEr-D (vectorised
n-gram counting), METEOR and SPICE through pycocoevalcap's jars; `terms` registers them."""
