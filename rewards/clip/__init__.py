"""CLIP-family scoring: the formulas (clip_s, ref_clip_s, f_clip_s, specs), the batched text/image
embedding scorer, the per-process family that shares one text pass per model, and spaCy nouns;
`terms` registers them as rewards and metrics."""
