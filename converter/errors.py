"""The one exception type of the converter.

Everything that is wrong with the input (a missing file, an unsupported architecture, a tensor
of the wrong shape, ...) is raised as ConversionError with a message meant for the user;
`convert.main` prints it as `error: ...` without a traceback.
"""


class ConversionError(Exception):
    """The checkpoint cannot be converted; the message says why."""
