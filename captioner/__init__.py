"""rlcap captioner: the Transformer captioner and its training (XE, SCST), evaluation, sweeps,
checkpoint selection and run reports. The top floor: it builds on plumbing, features and the
rewards package's face."""

from captioner.model import Captioner, ModelConfig
from captioner.train_config import TrainConfig
from plumbing.config import dump_config, load_config
from plumbing.errors import ConfigError, DataError, RlcapError

__all__ = ["Captioner", "ConfigError", "DataError", "ModelConfig", "RlcapError", "TrainConfig", "dump_config",
           "load_config"]
