"""Errors a user can act on. The app and the CLI show their message, never a traceback."""


class CALMError(Exception):
    """Base class: the message says what went wrong and what to do about it."""


class ModelLoadError(CALMError):
    """A model or tokenizer could not be loaded, or is not a causal LM we can compose."""


class IncompatibleBridgeError(CALMError):
    """A saved bridge does not fit the models it is being loaded onto."""
