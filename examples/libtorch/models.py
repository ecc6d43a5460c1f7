"""train_libtorch's two models (examples/libtorch/models.hpp) written in
Python with PyTorch, with the same parameter names: the peer of the tests
(tests/torch/libtorch_ddp.py) and of the benchmark (bench/libtorch_peer.py).
build(kind, keys): "lm" (keys vocab, block_size, dim, heads, layers) or
"resnet" (image, channels, depth, classes)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class Embed(nn.Module):
    def __init__(self, vocab, block_size, dim):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block_size, dim)

    def forward(self, ids):
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1]))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        h = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        att = h[0] @ h[1].transpose(-2, -1) / math.sqrt(hd)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), -1)
        y = (att @ h[2]).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, dim, vocab):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


class Lm(nn.Module):
    def __init__(self, k):
        super().__init__()
        vocab, block, dim = int(k["vocab"]), int(k["block_size"]), int(k["dim"])
        self.embed = Embed(vocab, block, dim)
        self.blocks = nn.Sequential(*[Block(dim, int(k["heads"])) for _ in range(int(k["layers"]))])
        self.head = Head(dim, vocab)

    def forward(self, ids):
        return self.head(self.blocks(self.embed(ids)))


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.gn1 = nn.GroupNorm(4, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.gn2 = nn.GroupNorm(4, c)

    def forward(self, x):
        h = torch.relu(self.gn1(self.conv1(x)))
        return torch.relu(x + self.gn2(self.conv2(h)))


class Stem(nn.Module):
    def __init__(self, c, size):
        super().__init__()
        self.size = size
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.gn = nn.GroupNorm(4, c)

    def forward(self, x):
        return torch.relu(self.gn(self.conv(x.view(-1, 3, self.size, self.size))))


class PoolHead(nn.Module):
    def __init__(self, c, classes):
        super().__init__()
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(x.mean((2, 3)))


class ResNet(nn.Module):
    def __init__(self, k):
        super().__init__()
        c = int(k["channels"])
        self.stem = Stem(c, int(k["image"]))
        self.layers = nn.Sequential(*[ResBlock(c) for _ in range(int(k["depth"]))])
        self.head = PoolHead(c, int(k["classes"]))

    def forward(self, x):
        return self.head(self.layers(self.stem(x)))


def build(kind, keys):
    return Lm(keys) if kind == "lm" else ResNet(keys)
