"""The one exception type for problems a user can fix, and how any exception is said in one line."""


class KronosError(ValueError):
    """Bad input, a bad checkpoint, bad data: a one-line message saying what and where.

    Subclasses ValueError so code written against the reference implementation,
    which raises ValueError for bad DataFrames, keeps catching it.
    """


class KronosWarning(UserWarning):
    """Something a user should change but that still works (e.g. an old config key): one line of text."""


def one_line(error: BaseException, typed: bool = True) -> str:
    """An exception as one line for a log, a table cell or a wrapping message: the first non-empty line of
    its message. With `typed`, an exception that is not a KronosError is prefixed with its type name
    ("KeyError: 'x'" says more than "'x'"); an empty message gives the type name alone."""
    line = next((" ".join(part.split()) for part in str(error).splitlines() if part.strip()), "")
    if not line:
        return type(error).__name__
    if typed and not isinstance(error, KronosError):
        return f"{type(error).__name__}: {line}"
    return line
