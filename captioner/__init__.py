"""rlcap captioner: data preparation, the offline world, the captioning model and its training."""

from captioner.config import dump_config, load_config
from captioner.errors import ConfigError, DataError, RlcapError
from captioner.model import Captioner, ModelConfig

__all__ = ["Captioner", "ConfigError", "DataError", "ModelConfig", "RlcapError", "dump_config", "load_config"]
