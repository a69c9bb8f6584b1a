"""rlcap's ground floor: plumbing every other package uses and nothing of theirs.

errors, atomic writes, typed YAML configs, command-line helpers, device choice, Karpathy/COCO
readers, the PTB tokenizer, tables, timing and the learning-rate schedule. Modules here import
only each other and third-party packages (docs/ARCHITECTURE.md, "Floors").
"""

from plumbing.errors import ConfigError, DataError, RlcapError

__all__ = ["ConfigError", "DataError", "RlcapError"]
