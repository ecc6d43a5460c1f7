"""Writes a small text and a byte-pair tokenizer trained on it (Hugging Face
`tokenizers`, no download), for hf_transformers_test's tokenize_data.py run.

usage: make_tokenizer.py OUT_DIR    writes OUT_DIR/text.txt and OUT_DIR/tokenizer.json
"""
import random
import sys

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

out = sys.argv[1]
random.seed(1)
words = ["the", "cat", "eats", "fish", "dog", "bones", "and", "a", "sleeps"]
with open(out + "/text.txt", "w") as f:
    f.write(" ".join(random.choice(words) for _ in range(6000)))
tok = Tokenizer(models.BPE(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train([out + "/text.txt"], trainers.BpeTrainer(vocab_size=61, special_tokens=["[UNK]"], show_progress=False))
tok.save(out + "/tokenizer.json")
