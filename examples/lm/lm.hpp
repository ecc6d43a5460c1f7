#pragma once
// The train_lm example: a Llama-family causal language model (hf::Llama)
// fine-tuned from a transformers checkpoint (model=DIR) or trained from a
// config (config=FILE), on a pre-tokenized stream of ids cut into blocks;
// optionally written back as a transformers directory (save_hf=DIR).
//
//   units: as hf::Llama (embedding, blocks, RMSNorm, lm_head)
//   batch: x int32 [B, block_size] ids, y int32 [B, block_size] the next ones
//   data:  a token file: .npy (1-D int32/int64) or .bin (dtrain token stream:
//          the 8 bytes "DTRNTOK1", a little-endian uint32 id width 2 or 4, a
//          uint32 0, then the ids little-endian)

#include <dtrain/data/dataset.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/hf/config.hpp>
#include <dtrain/hf/llama.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/dispatch.hpp"
#include "common/windows.hpp"

namespace lm {

struct Config : examples::Common {
  std::string model;             // a transformers model directory to fine-tune
  std::string config;            // or a config.json to train from scratch
  std::string data;              // the token file (.npy or .bin)
  std::int64_t block_size = 128; // positions per sequence
  std::string save_hf;           // write the trained model here as a transformers directory
  std::int64_t eval_batches = 8; // held-out batches per rank evaluated at the end
  std::int64_t generate = 0;     // at the end, continue the prompt by this many tokens
  std::vector<std::int64_t> prompt;  // its ids (default: the first 8 held-out tokens)
  std::int64_t top_k = 0;        // 0: greedy; k: sample among the k likeliest (seeded by seed)
};

// Continues `prompt` by `count` tokens with the trainer's model: greedy, or
// sampling among the top_k likeliest with a generator every rank seeds alike
// (so every rank produces the same text). A full forward per token: a smoke
// check of a trained model, not a fast decoder. Collective.
template <class Trainer>
std::vector<std::int64_t> generate(Trainer& trainer, std::vector<std::int64_t> ids, std::int64_t count,
                                   std::int64_t top_k, std::int64_t max_positions, std::int64_t vocab,
                                   std::uint64_t seed) {
  dtrain::detail::SplitMix64 rng(seed);
  for (std::int64_t n = 0; n < count; ++n) {
    const std::int64_t keep = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), max_positions);
    const std::vector<std::int64_t> window(ids.end() - keep, ids.end());
    dtrain::Batch b;
    b.set("x", dtrain::HostTensor::of(window, {1, keep}));
    const std::vector<float> logits = trainer.logits(b);
    const float* last = logits.data() + (keep - 1) * vocab;
    std::vector<std::int64_t> order(static_cast<std::size_t>(vocab));
    for (std::int64_t v = 0; v < vocab; ++v) order[static_cast<std::size_t>(v)] = v;
    const std::int64_t k = top_k > 0 ? std::min(top_k, vocab) : 1;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](std::int64_t a, std::int64_t c) { return last[a] > last[c] || (last[a] == last[c] && a < c); });
    std::int64_t next = order[0];
    if (k > 1) {  // softmax over the k likeliest
      std::vector<double> w(static_cast<std::size_t>(k));
      double total = 0;
      for (std::int64_t i = 0; i < k; ++i)
        total += w[static_cast<std::size_t>(i)] = std::exp(static_cast<double>(last[order[static_cast<std::size_t>(i)]] - last[order[0]]));
      double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53 * total;
      next = order[static_cast<std::size_t>(k - 1)];
      for (std::int64_t i = 0; i < k; ++i)
        if ((u -= w[static_cast<std::size_t>(i)]) < 0) {
          next = order[static_cast<std::size_t>(i)];
          break;
        }
    }
    ids.push_back(next);
  }
  return ids;
}

struct Tokens {
  std::vector<std::int32_t> ids;
  std::int64_t split;  // ids before it train, after it evaluate (the last tenth)
};

// Every id of `file`, checked against the vocabulary.
inline Tokens read_tokens(const std::string& file, std::int64_t block_size, std::int64_t vocab) {
  Tokens t;
  if (file.ends_with(".npy")) {
    const auto a = dtrain::detail::read_npy(file);
    if (a.shape.size() != 1)
      throw dtrain::config_error("'" + file + "' holds an array of " + std::to_string(a.shape.size()) +
                                     " dimensions, not a 1-D stream of token ids",
                                 "save the ids as one 1-D int32 or int64 array");
    t.ids = dtrain::detail::npy_labels(a, "'" + file + "'");
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw dtrain::config_error("cannot read the token file '" + file + "'", "pass data=FILE.npy or FILE.bin");
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::uint32_t width = 0, zero = 1;
    if (bytes.size() < 16 || std::memcmp(bytes.data(), "DTRNTOK1", 8) != 0 ||
        (std::memcpy(&width, bytes.data() + 8, 4), std::memcpy(&zero, bytes.data() + 12, 4), zero != 0) ||
        (width != 2 && width != 4) || (bytes.size() - 16) % width != 0)
      throw dtrain::config_error("'" + file + "' is not a dtrain token file (header DTRNTOK1, id width 2 or 4)",
                                 "give a 1-D int32/int64 .npy of ids, or a stream with that header");
    const std::size_t n = (bytes.size() - 16) / width;
    t.ids.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t v = 0;
      std::memcpy(&v, bytes.data() + 16 + i * width, width);  // little-endian host (checked by the data layer)
      t.ids[i] = static_cast<std::int32_t>(v);
    }
  }
  for (std::size_t i = 0; i < t.ids.size(); ++i)
    if (t.ids[i] < 0 || t.ids[i] >= vocab)
      throw dtrain::config_error("'" + file + "': token " + std::to_string(i) + " is id " + std::to_string(t.ids[i]) +
                                     ", outside the model's vocabulary of " + std::to_string(vocab),
                                 "tokenize with the model's own tokenizer");
  t.split = static_cast<std::int64_t>(t.ids.size()) * 9 / 10;
  if (t.split <= block_size || static_cast<std::int64_t>(t.ids.size()) - t.split <= block_size)
    throw dtrain::config_error("'" + file + "' has " + std::to_string(t.ids.size()) +
                                   " tokens: too few for blocks of block_size " + std::to_string(block_size) +
                                   " in both the training nine tenths and the held-out tenth",
                               "use more data or a smaller block_size");
  return t;
}

int train_host(const Config&, dtrain::World&, const dtrain::hf::LmConfig&, const Tokens&);
int train_cuda(const Config&, dtrain::World&, const dtrain::hf::LmConfig&, const Tokens&);

}  // namespace lm
