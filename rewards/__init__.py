"""rlcap rewards: caption normalisation, metrics and (in later stages) the reward bank."""

from rewards.ptb import ptb_tokenize

__all__ = ["ptb_tokenize"]
