#pragma once
// The train_gpt example: a small GPT (token and position embeddings, N
// pre-LayerNorm transformer blocks, a final LayerNorm and an untied linear
// head) trained as a character-level language model on a text file, or on
// a corpus the example generates (a few hundred KB, deterministic).
//
//   units: 0 nn::Embedding, 1 nn::PositionalEmbedding, 2 .. n_layer+1 blocks,
//          n_layer+2 nn::LayerNorm, n_layer+3 nn::Linear head (no bias)
//   batch: x int32 [B, block_size] characters, y int32 [B, block_size] the next ones
//   loss:  softmax cross-entropy over every position (mean over tokens)

#include <dtrain/trainer.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/dispatch.hpp"
#include "common/windows.hpp"

namespace gpt {

struct Config : examples::Common {
  std::string data = "generated";  // generated | a text file
  std::int64_t corpus_bytes = 300000;  // generated: its size
  std::uint64_t data_seed = 1;     // generated: the corpus (independent of seed)
  std::int64_t block_size = 64;    // positions per sequence
  std::int64_t n_layer = 2;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;
  std::int64_t eval_batches = 8;   // held-out batches per rank evaluated at the end
};

// [snippet:gpt_model]
struct Model {
  dtrain::nn::Embedding tok;                         // unit 0
  dtrain::nn::PositionalEmbedding pos;               // unit 1
  std::vector<dtrain::nn::TransformerBlock> blocks;  // units 2 .. n_layer + 1
  dtrain::nn::LayerNorm ln_f;                        // unit n_layer + 2
  dtrain::nn::Linear head;                           // unit n_layer + 3 (no bias)
  dtrain::nn::SoftmaxCrossEntropy loss;

  Model(std::int64_t vocab, std::int64_t block_size, std::int64_t n_layer, std::int64_t n_head, std::int64_t n_embd)
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
inline std::string generate_corpus(std::int64_t bytes, std::uint64_t seed) {
  static constexpr std::array<const char*, 8> animals{"cat", "dog", "fox", "owl", "bear", "mouse", "horse", "goat"};
  static constexpr std::array<const char*, 8> foods{"fish", "bones", "berries", "seeds", "honey", "cheese", "hay", "grass"};
  static constexpr std::array<const char*, 8> homes{"house", "yard", "forest", "barn", "cave", "wall", "field", "hill"};
  static constexpr std::array<const char*, 6> adjectives{"little", "old", "quick", "sleepy", "brown", "clever"};
  static constexpr std::array<const char*, 10> numbers{"zero", "one", "two", "three", "four",
                                                        "five", "six", "seven", "eight", "nine"};
  dtrain::SplitMix64 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng.next() % n); };
  std::string out;
  while (static_cast<std::int64_t>(out.size()) < bytes) {
    const std::size_t a = pick(animals.size());
    const std::string the = std::string("the ") + (pick(3) == 0 ? std::string(adjectives[pick(adjectives.size())]) + " " : "");
    switch (pick(4)) {
      case 0: out += the + animals[a] + " eats " + foods[a] + ". "; break;  // each animal eats one food
      case 1: out += the + animals[a] + " lives in the " + homes[a] + ". "; break;
      case 2: {
        const std::size_t x = pick(5), y = pick(5);
        out += std::string(numbers[x]) + " and " + numbers[y] + " make " + numbers[x + y] + ". ";
        break;
      }
      default: {
        const std::size_t b = pick(animals.size());
        out += the + animals[a] + " and the " + animals[b] + " sleep in the " + homes[b] + ".\n";
      }
    }
  }
  out.resize(static_cast<std::size_t>(bytes));
  return out;
}

// Characters as token ids (the sorted set of bytes of the text).
class CharTokenizer {
 public:
  explicit CharTokenizer(std::string_view text) {
    std::array<bool, 256> seen{};
    for (unsigned char ch : text) seen[ch] = true;
    id_.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (seen[static_cast<std::size_t>(b)]) {
        id_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(chars_.size());
        chars_.push_back(static_cast<char>(b));
      }
  }
  std::int64_t vocab() const { return static_cast<std::int64_t>(chars_.size()); }
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char ch : text) ids.push_back(id_[ch]);
    return ids;
  }

 private:
  std::array<std::int32_t, 256> id_{};
  std::string chars_;
};

using examples::Windows;

// The text to train on: the generated corpus or a file's bytes.
inline std::string load_text(const Config& c) {
  if (c.data == "generated") return generate_corpus(c.corpus_bytes, c.data_seed);
  std::ifstream in(c.data, std::ios::binary);
  if (!in) throw dtrain::config_error("cannot read the text file '" + c.data + "'", "pass data=generated or a readable file");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Corpus {
  CharTokenizer tokenizer;
  std::vector<std::int32_t> tokens;
  std::int64_t split;  // tokens before it train, after it evaluate (the last tenth)
};

inline Corpus make_corpus(const Config& c) {
  const std::string text = load_text(c);
  Corpus corpus{CharTokenizer(text), {}, 0};
  corpus.tokens = corpus.tokenizer.encode(text);
  corpus.split = static_cast<std::int64_t>(corpus.tokens.size()) * 9 / 10;
  if (corpus.split <= c.block_size || static_cast<std::int64_t>(corpus.tokens.size()) - corpus.split <= c.block_size)
    throw dtrain::config_error("the text has " + std::to_string(corpus.tokens.size()) +
                                   " characters: too few for windows of block_size " + std::to_string(c.block_size) +
                                   " in both the training nine tenths and the held-out tenth",
                               "use a longer text or a smaller block_size");
  return corpus;
}

int train_host(const Config&, dtrain::World&, const Corpus&);
int train_cuda(const Config&, dtrain::World&, const Corpus&);

}  // namespace gpt
