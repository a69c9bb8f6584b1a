"""English function words: a caption that ends in one was cut off or rambled ("a dog on a").

Shared by the bad-ending diagnostic (rewards) and bad-ending removal in decoding (captioner).
"""

FUNCTION_WORDS = frozenset([
    "a", "an", "the", "of", "and", "or", "with", "on", "in", "at", "to", "from", "by", "for", "near", "next", "is",
    "are", "was", "were", "its", "their", "his", "her", "this", "that", "some", "other", "while", "as", "into", "onto",
    "over", "under",
])
