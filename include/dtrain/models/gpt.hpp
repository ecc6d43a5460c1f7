#pragma once
// A ready model: train_gpt's small GPT with its keys (examples/gpt trains
// it): token and position embeddings, N pre-LayerNorm transformer blocks, a
// final LayerNorm and an untied linear head, a character-level language
// model; its tokenizer (a text's characters), and the text it learns: a
// file's, or a corpus generated from a seed (a few hundred KB of
// English-like sentences).
//
//   units: 0 nn::Embedding, 1 nn::PositionalEmbedding, 2 .. n_layer+1 blocks,
//          n_layer+2 nn::LayerNorm, n_layer+3 nn::Linear head (no bias)
//   batch: x int32 [B, block_size] characters, y int32 [B, block_size] the next ones
//   loss:  softmax cross-entropy over every position (mean over tokens)

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/models/run_config.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::models {

// train_gpt's keys that shape the model and its text.
struct GptConfig : RunConfig {
  std::string data = "generated";      // generated | a text file
  std::int64_t corpus_bytes = 300000;  // generated: its size
  std::uint64_t data_seed = 1;         // generated: the corpus (independent of seed)
  std::int64_t block_size = 64;        // positions per sequence
  std::int64_t n_layer = 2;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;
};

// [snippet:gpt_model]
struct Gpt {
  dtrain::nn::Embedding tok;                         // unit 0
  dtrain::nn::PositionalEmbedding pos;               // unit 1
  std::vector<dtrain::nn::TransformerBlock> blocks;  // units 2 .. n_layer + 1
  dtrain::nn::LayerNorm ln_f;                        // unit n_layer + 2
  dtrain::nn::Linear head;                           // unit n_layer + 3 (no bias)
  dtrain::nn::SoftmaxCrossEntropy loss;

  Gpt(std::int64_t vocab, std::int64_t block_size, std::int64_t n_layer, std::int64_t n_head, std::int64_t n_embd)
      : tok(vocab, n_embd),
        pos(block_size, n_embd),
        blocks(static_cast<std::size_t>(n_layer), dtrain::nn::TransformerBlock(n_embd, n_head)),
        ln_f(n_embd),
        head(n_embd, vocab, {.bias = false}) {}
  auto units() { return std::tie(tok, pos, blocks, ln_f, head); }
};
// [/snippet:gpt_model]

// English-like sentences from a small grammar with agreement and a few
// facts to learn (what animals eat, where they live, sums of small
// numbers): enough structure that the loss falls far below the character
// entropy, in any amount, the same for a given seed on every machine.
DTRAIN_DECL std::string generate_corpus(std::int64_t bytes, std::uint64_t seed);

// Characters as token ids (the sorted set of bytes of the text).
class CharTokenizer {
 public:
  DTRAIN_DECL explicit CharTokenizer(std::string_view text);
  std::int64_t vocab() const { return static_cast<std::int64_t>(chars_.size()); }
  DTRAIN_DECL std::vector<std::int32_t> encode(std::string_view text) const;

 private:
  std::array<std::int32_t, 256> id_{};
  std::string chars_;
};

// The text to train on: the generated corpus or a file's bytes.
DTRAIN_DECL std::string load_text(const GptConfig& c);

struct Corpus {
  CharTokenizer tokenizer;
  std::vector<std::int32_t> tokens;
  std::int64_t split;  // tokens before it train, after it evaluate (the last tenth)
};

// The config's text, tokenized and split; a config_error when the text has
// too few characters for a window of block_size in each part.
DTRAIN_DECL Corpus make_corpus(const GptConfig& c);

}  // namespace dtrain::models

#if DTRAIN_DEFINE_IMPL
#include "dtrain/models/gpt.ipp"
#endif
