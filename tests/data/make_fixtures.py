#!/usr/bin/python3
"""Writes the small files in tests/data/fixtures/ that the data tests read.

They come from real numpy.save / numpy.lib.format (and, for safetensors, an
independent Python writer following the published spec), so the C++ readers
are checked against files they did not write themselves. The values follow
the formulas in tests/data/fixture_values.hpp; rerun after changing either:
    /usr/bin/python3 tests/data/make_fixtures.py
"""
import json
import pathlib
import struct

import numpy as np

ROWS, FEATURES, CLASSES = 7, 3, 4
OUT = pathlib.Path(__file__).resolve().parent / "fixtures"


def features(dtype):
    i, j = np.meshgrid(np.arange(ROWS), np.arange(FEATURES), indexing="ij")
    return ((((i * 31 + j * 17) % 23) - 11.5) * 0.125).astype(dtype)


def labels(dtype):
    return ((np.arange(ROWS) * 5 + 1) % CLASSES).astype(dtype)


def save(name, array, version=None):
    with open(OUT / name, "wb") as f:
        np.lib.format.write_array(f, array, version=version, allow_pickle=False)


def write_safetensors(name, tensors, metadata):
    """The format from scratch: u64 header length, JSON header padded with
    spaces to 8 bytes, then the tensors' bytes back to back."""
    header = {"__metadata__": metadata}
    data = b""
    for key, (dtype, array) in tensors.items():
        raw = array.tobytes()
        header[key] = {"dtype": dtype, "shape": list(array.shape),
                       "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (OUT / name).write_bytes(struct.pack("<Q", len(text)) + text + data)


def main():
    OUT.mkdir(exist_ok=True)
    save("x_f32_v1.npy", features("<f4"), (1, 0))
    save("x_f64_v2.npy", features("<f8"), (2, 0))
    save("x_f32_v3.npy", features("<f4"), (3, 0))
    save("y_i64_v1.npy", labels("<i8"), (1, 0))
    save("y_i32_v2.npy", labels("<i4"), (2, 0))
    save("x_big_endian.npy", features(">f4"))
    save("x_fortran.npy", np.asfortranarray(features("<f4")))
    write_safetensors("python_written.safetensors",
                      {"x": ("F64", features("<f8")), "y": ("I32", labels("<i4"))},
                      {"writer": "make_fixtures.py"})


if __name__ == "__main__":
    main()
