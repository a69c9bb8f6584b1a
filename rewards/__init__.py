"""rlcap rewards: the reward bank, the metric suite and the scoring context they share.

This is the package's face: the captioner (and any user who only wants the metrics) imports from
here, `from rewards import MetricSuite, RewardBank, ScoringContext`. Importing it loads no model
and nothing of the captioner. Sub-packages by role: `text` (n-gram metrics), `clip` (CLIP-family
scores), `diagnostics`, `recipes` (training the reward models), `meta` (meta-evaluation) and
`benchmarks`; the commands (`python -m rewards.score`, ...) sit at the top.
"""

from plumbing.ptb import ptb_tokenize
from plumbing.references import load_predictions, load_references
from rewards.bank import RewardBank, RewardOutput, available_rewards, make_reward, register_reward
from rewards.context import ScoringContext, ScoringSettings
from rewards.meta.paired import sign_test
from rewards.normalize import Normalize, RewardNormalizer
from rewards.suite import (
    MetricOutput,
    MetricSpec,
    MetricSuite,
    ScoringData,
    SuiteResult,
    available_metrics,
    higher_is_better,
    register_metric,
)
from rewards.text.cider_df import document_frequency, save_df

__all__ = [
    "MetricOutput", "MetricSpec", "MetricSuite", "Normalize", "RewardBank", "RewardNormalizer", "RewardOutput",
    "ScoringContext", "ScoringData", "ScoringSettings", "SuiteResult",
    "available_metrics", "available_rewards", "document_frequency", "higher_is_better", "load_predictions",
    "load_references", "make_reward", "ptb_tokenize", "register_metric", "register_reward", "save_df", "sign_test",
]
