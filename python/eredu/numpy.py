"""`safetensors.numpy`, served by eredu: change the import, keep the code.

    from eredu.numpy import load_file, save_file    # was: from safetensors.numpy import ...

Files written here are the bytes safetensors writes for the same arrays and metadata (up to the
order of the metadata's keys, which safetensors does not fix either).
"""

from ._loading import load_file as _load_file
from ._writing import layout, load_bytes, numpy_entries, serialize, write_file

__all__ = ["load_file", "load", "save_file", "save"]


def load_file(filename, **options):
    """Every tensor of `filename` as numpy arrays (BF16 as uint16 bits; see eredu.load_file)."""
    return _load_file(filename, framework="np", **options)


def load(data, **options):
    """Every tensor of the safetensors file held in `data` (bytes), as numpy arrays."""
    return load_bytes(data, lambda path: _load_file(path, framework="np", **options))


def save(tensors, metadata=None):
    """The bytes of a safetensors file holding `tensors` ({name: numpy array}) and `metadata`
    ({str: str}), as safetensors.numpy.save writes them."""
    return serialize(numpy_entries(tensors), metadata)


def save_file(tensors, filename, metadata=None):
    """Writes save(tensors, metadata) to `filename`, whole or not at all (a temporary file
    beside it, renamed over it once complete)."""
    write_file(layout(numpy_entries(tensors), metadata), filename)
