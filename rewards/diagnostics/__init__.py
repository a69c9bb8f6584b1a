"""Caption diagnostics: text statistics of any captions, and grounding on the offline world."""
