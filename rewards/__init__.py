"""rlcap rewards: caption normalisation, the metric suite and the reward bank."""

from rewards.bank import RewardBank, RewardContext, available_rewards, register_reward
from rewards.ptb import ptb_tokenize
from rewards.suite import MetricContext, MetricSuite, available_metrics, register_metric

__all__ = ["MetricContext", "MetricSuite", "RewardBank", "RewardContext", "available_metrics", "available_rewards",
           "ptb_tokenize", "register_metric", "register_reward"]
