"""The exception hierarchy: every eredu failure is an `eredu.Error`.

The C++ library's `eredu::Error` reaches Python through `_from_native`, which picks the class
from the error's kind (then its family) and keeps the library's message unchanged, with the
parts it names as attributes:

    Error                      .kind .family .file .tensor .parameter .offset .errno .detail
    ├── FormatError            a malformed checkpoint (safetensors header, sharded index)
    ├── StoreError             reading
    │   ├── IoError            also an OSError: the OS failed a read, a truncated or changed file;
    │   │                      also the OSError subclass Python gives its errno (FileNotFoundError,
    │   │                      PermissionError, IsADirectoryError, NotADirectoryError, ...)
    │   ├── TensorNotFoundError  also a KeyError
    │   ├── SelectionError     also an IndexError: a slice that does not fit the tensor
    │   ├── BudgetError        a read larger than the staging budget
    │   └── ChecksumError      bytes that differ from their recorded SHA-256
    ├── RecipeError, DeclarationError     a cast or plan rejected before any read
    ├── OrchestrationError
    │   ├── CanaryError        a hot-swap's canary rejected the new version
    │   └── SwapInProgressError
    ├── BackendError
    │   ├── OutOfMemoryError   also a MemoryError
    │   └── ResourceExhaustedError  also an OSError: a thread or file descriptor refused
    ├── InvalidArgumentError   also a ValueError: a bad option or argument
    ├── UnsupportedDTypeError  also a TypeError: a dtype the framework cannot hold
    └── CancelledError         also an asyncio.CancelledError
"""

import asyncio
import builtins
import errno
import os

__all__ = [
    "Error", "SafetensorError", "SharedTensorsError", "FormatError", "StoreError", "IoError", "TensorNotFoundError", "SelectionError", "BudgetError",
    "ChecksumError", "RecipeError", "DeclarationError", "OrchestrationError", "CanaryError", "SwapInProgressError",
    "BackendError", "OutOfMemoryError", "ResourceExhaustedError", "InvalidArgumentError", "UnsupportedDTypeError",
    "CancelledError",
]


class Error(Exception):
    """An eredu failure. `str(e)` is the library's message, which names file, tensor and offset;
    where safetensors raises the same error in words code may match (a missing file, a slice out
    of bounds), `str(e)` is those words and the library's message is the exception's note
    (PEP 678: tracebacks print it), and `e.message` either way."""

    def __init__(self, message, *, kind="unknown", family=None, detail=None, file=None, tensor=None,
                 parameter=None, offset=None, os_errno=None, text=None):
        super().__init__(message if text is None else text)
        self.message = message
        self.text = text            # safetensors' words for this error, or None
        if text is not None and hasattr(self, "add_note"):
            self.add_note(message)
        self.kind = kind            # the errc name: "invalid_offset", "checksum_mismatch", ...
        self.family = family        # "format", "store", "recipe", "declaration", "orchestration", "backend"
        self.detail = detail if detail is not None else message
        self.file = file or None
        self.tensor = tensor or None
        self.parameter = parameter or None
        self.offset = offset        # absolute byte offset in the file, or None
        self.errno = os_errno       # the OS error number of an I/O failure, or None
        self.os_errno = os_errno    # the same, kept in __dict__ (OSError's errno is a slot)
        _os_fields(self)

    def __str__(self):
        return self.message if self.text is None else self.text

    def __reduce__(self):  # picklable (multiprocessing, pytest-xdist) with its attributes
        cls = type(self)
        return (_rebuild, (_IO_BY_ERRNO_CLASS_NAME.get(cls, cls), self.message, self.__dict__.copy()))


def _os_fields(e):
    """OSError's own fields of an eredu error that is an OSError, so that code written for OSError
    (`e.filename`, `e.strerror`) reads them: the file the message names, the errno's text."""
    if isinstance(e, OSError):
        e.errno = e.os_errno
        e.filename = e.file
        e.strerror = os.strerror(e.os_errno) if e.os_errno else None


def _rebuild(cls, message, state):
    if isinstance(cls, str):  # an IoError subclass made for an errno (io_error_class), by its builtin's name
        cls = _IO_BY_BUILTIN[getattr(builtins, cls)]
    e = cls(message)
    e.__dict__.update(state)
    _os_fields(e)
    return e


# safetensors raises its SafetensorError (an Exception) for what eredu raises as one of the
# classes below: code that catches it keeps catching eredu's failures once its import names eredu.
SafetensorError = Error


class FormatError(Error):
    """The checkpoint is malformed (header, index, discovery)."""


class StoreError(Error):
    """Reading failed."""


class IoError(StoreError, OSError):
    """The operating system failed a read, or the file was truncated or changed underneath."""


# The OSError subclasses Python's own OSError(errno, ...) picks for an errno (PEP 3151), each with
# an IoError beneath it, so that both `except FileNotFoundError` and `except eredu.IoError` catch a
# missing file. They are named as the builtin they extend and are not exported by name: a
# `from eredu import *` must not shadow the builtins (pickling goes by the builtin's name).
_IO_BY_BUILTIN = {
    base: type(base.__name__, (IoError, base), {
        "__module__": __name__,
        "__doc__": f"An IoError whose errno Python maps to {base.__name__} (also a {base.__name__}).",
    })
    for base in (builtins.BlockingIOError, builtins.ChildProcessError, builtins.BrokenPipeError,
                 builtins.ConnectionAbortedError, builtins.ConnectionRefusedError, builtins.ConnectionResetError,
                 builtins.FileExistsError, builtins.FileNotFoundError, builtins.InterruptedError,
                 builtins.IsADirectoryError, builtins.NotADirectoryError, builtins.PermissionError,
                 builtins.ProcessLookupError, builtins.TimeoutError)
}
_IO_BY_ERRNO_CLASS_NAME = {cls: base.__name__ for base, cls in _IO_BY_BUILTIN.items()}


def io_error_class(os_errno):
    """The IoError class an I/O failure with `os_errno` is raised as: IoError, or its subclass that is
    also the OSError subclass Python itself raises for that errno (ENOENT: FileNotFoundError, EACCES
    and EPERM: PermissionError, EISDIR: IsADirectoryError, ENOTDIR: NotADirectoryError, ...)."""
    if not os_errno:
        return IoError
    return _IO_BY_BUILTIN.get(type(OSError(os_errno, "")), IoError)


class TensorNotFoundError(StoreError, KeyError):
    """No tensor of that name."""


class SelectionError(StoreError, IndexError):
    """A selection (slice) that does not fit the tensor, or an index form that is not supported."""


class BudgetError(StoreError):
    """A read larger than the staging budget."""


class ChecksumError(StoreError):
    """A tensor's bytes differ from the SHA-256 the checkpoint records."""


class RecipeError(Error):
    """A recipe (a cast) rejected before any read."""


class DeclarationError(Error):
    """A binding declaration rejected."""


class OrchestrationError(Error):
    """Binding a loaded unit failed (a missing or unexpected tensor, ...)."""


class CanaryError(OrchestrationError):
    """A hot-swap's canary rejected the new version; the old one keeps serving."""


class SwapInProgressError(OrchestrationError):
    """Another swap of the same slot is running."""


class BackendError(Error):
    """The CPU backend failed (a shape or dtype refused at bind, an allocation)."""


class OutOfMemoryError(BackendError, MemoryError):
    """Tensor storage could not be allocated."""


class ResourceExhaustedError(BackendError, OSError):
    """The system refused a thread, file descriptor or locked memory the operation needed."""


class CollectiveError(Error):
    """A collective across ranks failed, timed out, or its group is unusable."""


class InvalidArgumentError(Error, ValueError):
    """An option or argument out of range."""


class SharedTensorsError(InvalidArgumentError, RuntimeError):
    """Tensors given to save that share memory (a RuntimeError too, as safetensors raises): saving
    both would write the memory twice and load them back untied. save_model handles them."""


class UnsupportedDTypeError(Error, TypeError):
    """A dtype the framework cannot hold; ask for raw bytes or a cast."""


class RemoteError(IoError):
    """A remote source (HTTP/S, S3) failed: a status, a transport failure after the retries, TLS."""


class AccessDeniedError(RemoteError, PermissionError):
    """The server refused the credentials or the request (HTTP 401/403)."""


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """The server has no such object or bucket (HTTP 404)."""


class RemoteTimeoutError(RemoteError, TimeoutError):
    """A connection or a stalled transfer passed its time limit, after the retries."""


class CancelledError(Error, asyncio.CancelledError):
    """The operation was cancelled (also an asyncio.CancelledError)."""


_BY_KIND = {
    "io_error": IoError, "unexpected_eof": IoError, "file_changed": IoError, "direct_io_unsupported": IoError,
    "uring_unavailable": IoError,
    "tensor_not_found": TensorNotFoundError,
    "invalid_selection": SelectionError,
    "exceeds_budget": BudgetError,
    "checksum_mismatch": ChecksumError,
    "canary_failed": CanaryError,
    "swap_in_progress": SwapInProgressError,
    "out_of_memory": OutOfMemoryError,
    "resource_exhausted": ResourceExhaustedError,
    "access_denied": AccessDeniedError, "remote_not_found": RemoteNotFoundError, "timed_out": RemoteTimeoutError,
    "range_unsupported": RemoteError, "tls_error": RemoteError, "remote_error": RemoteError,
    "version_not_published": StoreError, "version_withdrawn": StoreError,
    "invalid_argument": InvalidArgumentError,
    "cancelled": CancelledError,
    "unsupported_dtype": UnsupportedDTypeError,
}
_BY_FAMILY = {
    "format": FormatError, "store": StoreError, "recipe": RecipeError, "declaration": DeclarationError,
    "orchestration": OrchestrationError, "backend": BackendError, "collective": CollectiveError,
}


def error_class(kind, family=None, os_errno=None):
    """The class an error of `kind` (and `family`, and for an I/O error its errno) is raised as."""
    cls = _BY_KIND.get(kind) or _BY_FAMILY.get(family) or Error
    return io_error_class(os_errno) if cls is IoError else cls


def _from_native(kind, family, message, detail, file, tensor, parameter, offset, os_errno):
    """Called by the extension for every eredu::Error it raises."""
    cls = error_class(kind, family, os_errno)
    # A missing file in safetensors' words (its FileNotFoundError), the library's message as the note.
    text = f"No such file or directory: {printable(file)}" if os_errno == errno.ENOENT and file else None
    e = cls(message, kind=kind, family=family, detail=detail, file=file, tensor=tensor, parameter=parameter,
            offset=offset, os_errno=os_errno, text=text)
    return e


def printable(text):
    """`text` (a str, surrogate escapes included, or bytes) as one printable line, escaped as the C++
    library's eredu::printable escapes names in its messages: NUL as \\0; newline, tab and carriage
    return as \\n, \\t, \\r; other control characters and bytes that are not UTF-8 as \\xNN.
    Names come from files and directories others may control: a message must not act on a terminal,
    forge log lines, or fail to encode when printed."""
    if isinstance(text, bytes):
        raw = text
    else:
        try:
            raw = str(text).encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte decodes to: spelled out as Python spells it
            raw = str(text).encode("utf-8", "backslashreplace")
    out = []
    for ch in raw.decode("utf-8", "surrogateescape"):
        c = ord(ch)
        if 0xDC80 <= c <= 0xDCFF:  # a byte that is not UTF-8
            out.append(f"\\x{c - 0xDC00:02x}")
        elif c == 0:
            out.append("\\0")
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        elif c < 0x20 or c == 0x7F:
            out.append(f"\\x{c:02x}")
        elif 0x80 <= c <= 0x9F:  # C1 controls, escaped byte by byte as their UTF-8 encoding
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def python_error(kind, detail, *, file=None, tensor=None, text=None):
    """An error raised by the Python layer, with a message composed as the library composes its own:
    "<file>: tensor '<name>': <detail> [<kind>]", made printable as the library makes its own."""
    parts = []
    if file:
        parts.append(f"{file}: ")
    if tensor:
        parts.append(f"tensor '{tensor}': ")
    message = printable("".join(parts) + f"{detail} [{kind}]")
    family = "store" if kind in ("invalid_selection", "tensor_not_found") else None
    if kind == "size_overflow":
        family = "format"
    return error_class(kind, family)(message, kind=kind, family=family, detail=detail, file=file, tensor=tensor,
                                     text=text)
