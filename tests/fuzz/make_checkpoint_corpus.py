#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_checkpoint_open (tests/fuzz/checkpoint_corpus/).

Each seed is an archive in the harness's layout (see fuzz_checkpoint_open.cpp): layout byte,
flags byte, file-count byte, u32 lengths of every file but the last, then the files. The seeds
are valid checkpoints of every layout, with both readers and both budgets, so that the fuzzer
starts from inputs that get past the parsers to the reads.

usage: tests/fuzz/make_checkpoint_corpus.py [OUTDIR]
"""
import json
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent


def safetensors(tensors, metadata=None):
    """tensors: name -> (dtype, shape, bytes), laid out in the given order."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, alignment=32):
    """kvs: list of (key, gguf type, packed value); tensors: list of (name, ne, ggml type, bytes)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, kind, value in kvs:
        out += gguf_string(key) + struct.pack("<I", kind) + value
    offset, data = 0, b""
    for name, ne, kind, raw in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        out += struct.pack("<IQ", kind, offset)
        pad = b"\0" * (-len(raw) % alignment)
        data += raw + pad
        offset += len(raw) + len(pad)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def archive(layout, flags, files):
    out = bytes([layout, flags, (len(files) - (2 if layout == 1 else 1)) % 4])
    for f in files[:-1]:
        out += struct.pack("<I", len(f))
    return out + b"".join(files)


def f32(*values):
    return struct.pack(f"<{len(values)}f", *values)


def main():
    outdir = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "checkpoint_corpus"
    outdir.mkdir(parents=True, exist_ok=True)
    seeds = {}

    single = safetensors({"a": ("F32", [3, 2], f32(*range(6))), "b": ("BF16", [4], bytes(range(8)))},
                         {"format": "pt"})
    seeds["safetensors_file"] = archive(0, 0, [single])

    shard1 = safetensors({"w1": ("F16", [2, 3], bytes(range(12)))})
    shard2 = safetensors({"w2": ("I8", [5, 1], bytes(range(5))), "w3": ("F32", [1], f32(7))})
    index = json.dumps({"metadata": {"total_size": 12 + 5 + 4}, "weight_map": {
        "w1": "model-00001-of-00002.safetensors", "w2": "model-00002-of-00002.safetensors",
        "w3": "model-00002-of-00002.safetensors"}}).encode()
    seeds["safetensors_sharded"] = archive(1, 1, [index, shard1, shard2])

    q8_0 = struct.pack("<e", 0.5) + bytes(range(32))  # one block of 32 weights
    one = gguf([("general.architecture", 8, gguf_string("llama")), ("general.alignment", 4, struct.pack("<I", 32))],
               [("tok", [4, 2], 0, f32(*range(8))), ("q", [32, 2], 8, q8_0 * 2)])
    seeds["gguf_file"] = archive(2, 3, [one])

    def split_kvs(no):
        return [("split.no", 2, struct.pack("<H", no)), ("split.count", 2, struct.pack("<H", 2)),
                ("split.tensors.count", 5, struct.pack("<i", 2))]
    part1 = gguf(split_kvs(0), [("x", [2, 2], 0, f32(1, 2, 3, 4))])
    part2 = gguf(split_kvs(1), [("y", [32], 8, q8_0)])
    seeds["gguf_split"] = archive(3, 2, [part1, part2])

    for name, data in seeds.items():
        (outdir / name).write_bytes(data)
    print(f"wrote {len(seeds)} seeds to {outdir}")


if __name__ == "__main__":
    main()
