#!/usr/bin/env python3
"""Tokenizes text files into a dtrain token stream for train_lm.

usage: tokenize_data.py --tokenizer PATH --out FILE.bin TEXT [TEXT ...]
  --tokenizer  a tokenizer.json, or a model directory holding one (what
               save_pretrained writes for a transformers tokenizer)
  --eos ID     append this id after every file (default: none)

Writes the ids of every file, in order: the 8 bytes "DTRNTOK1", the id
width as a little-endian uint32 (2 when every id fits 16 bits, else 4), a
uint32 0, then the ids little-endian. Tokenizing is Hugging Face
`tokenizers` (pip install tokenizers, or the transformers it comes with);
dtrain itself only reads ids.
"""
import argparse
import os
import struct
import sys


def fail(message):
    print(f"tokenize_data.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    p = argparse.ArgumentParser(description="text files -> a dtrain token stream (.bin) for train_lm")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--eos", type=int, default=None)
    p.add_argument("texts", nargs="+")
    a = p.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        fail("the Python package 'tokenizers' is missing (pip install tokenizers)")
    path = os.path.join(a.tokenizer, "tokenizer.json") if os.path.isdir(a.tokenizer) else a.tokenizer
    if not os.path.isfile(path):
        fail(f"no tokenizer at {path!r}: give a tokenizer.json or a directory holding one")
    tok = Tokenizer.from_file(path)
    ids = []
    for t in a.texts:
        try:
            with open(t, encoding="utf-8") as f:
                ids.extend(tok.encode(f.read(), add_special_tokens=False).ids)
        except (OSError, UnicodeDecodeError) as e:
            fail(f"cannot read {t!r} as UTF-8 text: {e}")
        if a.eos is not None:
            ids.append(a.eos)
    if not ids:
        fail("the texts hold no tokens")
    width = 2 if max(ids) < 65536 else 4
    tmp = a.out + ".partial"
    with open(tmp, "wb") as f:
        f.write(b"DTRNTOK1" + struct.pack("<II", width, 0))
        f.write(struct.pack(f"<{len(ids)}{'H' if width == 2 else 'I'}", *ids))
    os.replace(tmp, a.out)
    print(f"{a.out}: {len(ids)} tokens, ids of {width} bytes, vocabulary {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
