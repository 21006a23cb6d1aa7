"""get_slice indexing: the index forms Hugging Face safetensors' PySafeSlice accepts, turned into
one (start, stop) range per dimension that eredu reads — only the selected bytes.

Accepted: integers (negative ones count from the end; the dimension is dropped), slices with a
step of 1 or none, one `...`, fewer indices than dimensions (the rest are whole), and the empty
list `[]` (an empty selection of dimension 0, as safetensors and numpy give). Bounds are not
clamped: as in safetensors >= 0.6, a slice bound past its dimension (`[:20]` of 10 rows) raises
SelectionError "index 19 out of bounds for tensor dimension #0 of size 10", as does an integer
out of range. A slice may start at the dimension's size or after its stop: the range is empty
then, as in numpy. Rejected with SelectionError: steps other than 1, `None`/`np.newaxis`,
booleans, non-empty lists and arrays (fancy indexing), more indices than dimensions.
docs/python.md lists where this differs from safetensors, and why.
"""

import operator

from ._errors import python_error


def _error(detail, name, file, text=None):
    """SelectionError naming file and tensor; `text`: safetensors' words for it, which str() gives
    (the library's message is then the exception's note)."""
    return python_error("invalid_selection", detail, file=file, tensor=name, text=text)


def _spell(items):
    """`items` as safetensors spells a selection in its messages: "[:20]", "[2:, 20]"."""
    def one(i):
        if i is Ellipsis:
            return "..."
        if isinstance(i, slice):
            text = ("" if i.start is None else str(i.start)) + ":" + ("" if i.stop is None else str(i.stop))
            return text if i.step is None else f"{text}:{i.step}"
        return repr(i) if not isinstance(i, int) else str(i)
    return "[" + ", ".join(one(i) for i in items) + "]"


def _index(value, dim, name, file):
    """`value` as an int (anything with __index__ except a bool), or SelectionError."""
    if value is None or isinstance(value, bool) or type(value).__name__ == "bool_":
        raise _error(f"dimension {dim}: index {value!r} is not supported (ints, slices with step 1 and '...' are)",
                     name, file)
    if isinstance(value, list) and value:
        raise _error(f"dimension {dim}: a non-empty list (fancy indexing) is not supported", name, file,
                     text="Non empty lists are not implemented")
    try:
        return operator.index(value)
    except TypeError:
        raise _error(f"dimension {dim}: an index of type {type(value).__name__} is not supported "
                     f"(ints, slices with step 1 and '...' are)", name, file) from None


def selection(index, shape, *, name=None, file=None):
    """(ranges, result_shape) for `tensor[index]` of a tensor of `shape`."""
    if type(index) is list and not index:
        index = slice(0, 0)  # safetensors' and numpy's `t[[]]`: no row of dimension 0
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

    def out_of_bounds(asked, dim, size):
        # safetensors' own words (its slice.rs), after the selection and the tensor's shape.
        words = (f"slicing {_spell(items)} with shape {list(shape)}: index {asked} out of bounds for tensor "
                 f"dimension #{dim} of size {size}")
        return _error(words, name, file, text="Error during " + words)

    ranges, result = [], []
    for dim, (i, size) in enumerate(zip(expanded, shape)):
        if isinstance(i, slice):
            if i.step is not None and _index(i.step, dim, name, file) != 1:
                raise _error(f"dimension {dim}: a step of {i.step} is not supported (only 1)", name, file)
            start = 0 if i.start is None else _index(i.start, dim, name, file)
            stop = size if i.stop is None else _index(i.stop, dim, name, file)
            if start < -size:
                raise out_of_bounds(start, dim, size)
            if stop < -size:
                raise out_of_bounds(stop, dim, size)
            start += size if start < 0 else 0
            stop += size if stop < 0 else 0
            if start > size:
                raise out_of_bounds(start, dim, size)
            if stop > size:
                raise out_of_bounds(stop - 1, dim, size)  # the last row asked for, as safetensors says
            stop = max(stop, start)
            ranges.append((start, stop))
            result.append(stop - start)
            continue
        k = _index(i, dim, name, file)
        if k < -size:  # safetensors' words for a negative index past the start
            raise _error(f"index {k} out of bounds for tensor dimension #{dim} of size {size}", name, file,
                         text=f"Invalid index {k} for dimension {dim} of size {size}")
        if k >= size:
            raise out_of_bounds(k, dim, size)
        k %= size
        ranges.append((k, k + 1))
    return ranges, tuple(result)
