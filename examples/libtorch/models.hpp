#pragma once
// train_libtorch's two models, written with LibTorch's torch::nn as a user
// would write them, nothing of dtrain in them: a GPT-style transformer
// language model and a small residual image classifier. tests/torch and
// tests/torch/models.py (the same models in Python) use them too.

#include <torch/torch.h>

#include <cmath>
#include <cstdint>

namespace libtorch_models {

// Token and position embeddings: ids [B, T] -> [B, T, dim].
struct EmbedImpl : torch::nn::Module {
  EmbedImpl(std::int64_t vocab, std::int64_t block_size, std::int64_t dim)
      : tok(register_module("tok", torch::nn::Embedding(vocab, dim))),
        pos(register_module("pos", torch::nn::Embedding(block_size, dim))) {}
  torch::Tensor forward(torch::Tensor ids) {
    const auto positions = torch::arange(ids.size(1), torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    return tok(ids) + pos(positions);
  }
  torch::nn::Embedding tok, pos;
};
TORCH_MODULE(Embed);

// A pre-norm transformer block: causal self-attention and a GELU MLP, each
// with a residual. [B, T, dim] -> [B, T, dim].
struct BlockImpl : torch::nn::Module {
  BlockImpl(std::int64_t dim, std::int64_t heads)
      : heads(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        proj(register_module("proj", torch::nn::Linear(dim, dim))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", torch::nn::Linear(dim, 4 * dim))),
        fc2(register_module("fc2", torch::nn::Linear(4 * dim, dim))) {}
  torch::Tensor forward(torch::Tensor x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    auto h = qkv(ln1(x)).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});  // 3, B, heads, T, hd
    auto att = torch::matmul(h[0], h[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    const auto future = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = torch::softmax(att.masked_fill(future, -INFINITY), -1);
    auto y = torch::matmul(att, h[2]).transpose(1, 2).reshape({b, t, d});
    x = x + proj(y);
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }
  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

// The final norm and the vocabulary projection: [B, T, dim] -> [B, T, vocab].
struct HeadImpl : torch::nn::Module {
  HeadImpl(std::int64_t dim, std::int64_t vocab)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        out(register_module("out", torch::nn::Linear(torch::nn::LinearOptions(dim, vocab).bias(false)))) {}
  torch::Tensor forward(torch::Tensor x) { return out(ln(x)); }
  torch::nn::LayerNorm ln;
  torch::nn::Linear out;
};
TORCH_MODULE(Head);

struct LmImpl : torch::nn::Module {
  LmImpl(std::int64_t vocab, std::int64_t block_size, std::int64_t dim, std::int64_t heads, std::int64_t layers)
      : embed(register_module("embed", Embed(vocab, block_size, dim))),
        blocks(register_module("blocks", torch::nn::Sequential())),
        head(register_module("head", Head(dim, vocab))) {
    for (std::int64_t i = 0; i < layers; ++i) blocks->push_back(Block(dim, heads));
  }
  torch::Tensor forward(torch::Tensor ids) { return head(blocks->forward(embed(ids))); }
  Embed embed;
  torch::nn::Sequential blocks;
  Head head;
};
TORCH_MODULE(Lm);

// A residual block with group normalisation (batch statistics would make
// each rank's result depend on its share of the batch).
struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(std::int64_t channels)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))),
        gn1(register_module("gn1", torch::nn::GroupNorm(4, channels))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))),
        gn2(register_module("gn2", torch::nn::GroupNorm(4, channels))) {}
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(gn1(conv1(x)));
    return torch::relu(x + gn2(conv2(h)));
  }
  torch::nn::Conv2d conv1;
  torch::nn::GroupNorm gn1;
  torch::nn::Conv2d conv2;
  torch::nn::GroupNorm gn2;
};
TORCH_MODULE(ResBlock);

// Flat images [B, 3 * size * size] -> [B, channels, size, size].
struct StemImpl : torch::nn::Module {
  StemImpl(std::int64_t channels, std::int64_t size)
      : size(size),
        conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, channels, 3).padding(1)))),
        gn(register_module("gn", torch::nn::GroupNorm(4, channels))) {}
  torch::Tensor forward(torch::Tensor x) { return torch::relu(gn(conv(x.view({-1, 3, size, size})))); }
  std::int64_t size;
  torch::nn::Conv2d conv;
  torch::nn::GroupNorm gn;
};
TORCH_MODULE(Stem);

// Global average pooling and the classifier: [B, channels, H, W] -> [B, classes].
struct PoolHeadImpl : torch::nn::Module {
  PoolHeadImpl(std::int64_t channels, std::int64_t classes)
      : fc(register_module("fc", torch::nn::Linear(channels, classes))) {}
  torch::Tensor forward(torch::Tensor x) { return fc(x.mean({2, 3})); }
  torch::nn::Linear fc;
};
TORCH_MODULE(PoolHead);

struct ResNetImpl : torch::nn::Module {
  ResNetImpl(std::int64_t channels, std::int64_t size, std::int64_t depth, std::int64_t classes)
      : stem(register_module("stem", Stem(channels, size))),
        layers(register_module("layers", torch::nn::Sequential())),
        head(register_module("head", PoolHead(channels, classes))) {
    for (std::int64_t i = 0; i < depth; ++i) layers->push_back(ResBlock(channels));
  }
  torch::Tensor forward(torch::Tensor x) { return head(layers->forward(stem(x))); }
  Stem stem;
  torch::nn::Sequential layers;
  PoolHead head;
};
TORCH_MODULE(ResNet);

}  // namespace libtorch_models
