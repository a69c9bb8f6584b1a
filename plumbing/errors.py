"""Errors that a command reports to the user as one clear line and a non-zero exit."""


class RlcapError(Exception):
    """Base class: the message names the file, id or key at fault."""


class ConfigError(RlcapError):
    """A config key is unknown, has the wrong type, or a config file cannot be read."""


class DataError(RlcapError):
    """An input file (dataset.json, images, features, labels) is malformed or inconsistent."""
