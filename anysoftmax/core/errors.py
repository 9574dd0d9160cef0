"""The errors anysoftmax raises besides TypeError/IndexError/ValueError for bad arguments."""


class BackendUnavailableError(RuntimeError):
    """The chosen backend cannot run on this machine (missing package, device, driver)."""


class UnsupportedRequestError(RuntimeError):
    """The chosen backend runs here but does not support this request (dtype, device, shape)."""
