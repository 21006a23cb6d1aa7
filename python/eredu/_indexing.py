"""get_slice indexing: the index forms Hugging Face safetensors' PySafeSlice accepts, turned into
one (start, stop) range per dimension that eredu reads — only the selected bytes.

Accepted: integers (negative ones count from the end; the dimension is dropped), slices with a
step of 1 or none (bounds clamped as Python clamps them; an empty range gives an empty
dimension), one `...`, and fewer indices than dimensions (the rest are whole). Rejected with
SelectionError: steps other than 1, `None`/`np.newaxis`, booleans, lists and arrays (fancy
indexing), more indices than dimensions, and integers out of range.
"""

import operator

from ._errors import python_error


def _error(detail, name, file):
    return python_error("invalid_selection", detail, file=file, tensor=name)


def selection(index, shape, *, name=None, file=None):
    """(ranges, result_shape) for `tensor[index]` of a tensor of `shape`."""
    items = index if isinstance(index, tuple) else (index,)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise _error("an index can only have a single ellipsis ('...')", name, file)
    explicit = sum(1 for i in items if i is not Ellipsis)
    if explicit > len(shape):
        raise _error(f"too many indices for a tensor of rank {len(shape)}: {explicit}", name, file)
    expanded = []
    for i in items:
        if i is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - explicit))
        else:
            expanded.append(i)
    expanded.extend([slice(None)] * (len(shape) - len(expanded)))

    ranges, result = [], []
    for dim, (i, size) in enumerate(zip(expanded, shape)):
        if isinstance(i, slice):
            start, stop, step = i.indices(size)
            if step != 1:
                raise _error(f"dimension {dim}: a step of {i.step} is not supported (only 1)", name, file)
            stop = max(stop, start)
            ranges.append((start, stop))
            result.append(stop - start)
            continue
        if i is None or isinstance(i, bool) or type(i).__name__ == "bool_":
            raise _error(f"dimension {dim}: index {i!r} is not supported (ints, slices with step 1 and '...' are)",
                         name, file)
        try:
            k = operator.index(i)
        except TypeError:
            raise _error(f"dimension {dim}: an index of type {type(i).__name__} is not supported "
                         f"(ints, slices with step 1 and '...' are)", name, file) from None
        if not -size <= k < size:
            raise _error(f"dimension {dim}: index {k} is out of range for size {size}", name, file)
        k %= size
        ranges.append((k, k + 1))
    return ranges, tuple(result)
