// The definitions gpt.hpp declares with DTRAIN_DECL (core/macros.hpp).
#pragma once

#include <fstream>
#include <iterator>

#include "dtrain/core/error.hpp"
#include "dtrain/model/init.hpp"
#include "dtrain/models/gpt.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::models {
  DTRAIN_DECL std::string generate_corpus(std::int64_t bytes, std::uint64_t seed) {
    static constexpr std::array<const char*, 8> animals{"cat", "dog", "fox", "owl", "bear", "mouse", "horse", "goat"};
    static constexpr std::array<const char*, 8> foods{"fish",  "bones",  "berries", "seeds",
                                                      "honey", "cheese", "hay",     "grass"};
    static constexpr std::array<const char*, 8> homes{"house", "yard", "forest", "barn",
                                                      "cave",  "wall", "field",  "hill"};
    static constexpr std::array<const char*, 6> adjectives{"little", "old", "quick", "sleepy", "brown", "clever"};
    static constexpr std::array<const char*, 10> numbers{"zero", "one", "two",   "three", "four",
                                                         "five", "six", "seven", "eight", "nine"};
    SplitMix64 rng(seed);
    auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng.next() % n); };
    std::string out;
    while (static_cast<std::int64_t>(out.size()) < bytes) {
      const std::size_t a = pick(animals.size());
      const std::string the =
          std::string("the ") + (pick(3) == 0 ? std::string(adjectives[pick(adjectives.size())]) + " " : "");
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

  DTRAIN_DECL CharTokenizer::CharTokenizer(std::string_view text) {
    std::array<bool, 256> seen{};
    for (unsigned char ch : text) seen[ch] = true;
    id_.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (seen[static_cast<std::size_t>(b)]) {
        id_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(chars_.size());
        chars_.push_back(static_cast<char>(b));
      }
  }

  DTRAIN_DECL std::vector<std::int32_t> CharTokenizer::encode(std::string_view text) const {
    std::vector<std::int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char ch : text) ids.push_back(id_[ch]);
    return ids;
  }

  DTRAIN_DECL std::string load_text(const GptConfig& c) {
    if (c.data == "generated") return generate_corpus(c.corpus_bytes, c.data_seed);
    std::ifstream in(c.data, std::ios::binary);
    if (!in) throw config_error("cannot read the text file '" + c.data + "'", "pass data=generated or a readable file");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  DTRAIN_DECL Corpus make_corpus(const GptConfig& c) {
    const std::string text = load_text(c);
    Corpus corpus{CharTokenizer(text), {}, 0};
    corpus.tokens = corpus.tokenizer.encode(text);
    corpus.split = static_cast<std::int64_t>(corpus.tokens.size()) * 9 / 10;
    if (corpus.split <= c.block_size || static_cast<std::int64_t>(corpus.tokens.size()) - corpus.split <= c.block_size)
      throw config_error("the text has " + std::to_string(corpus.tokens.size()) +
                             " characters: too few for windows of block_size " + std::to_string(c.block_size) +
                             " in both the training nine tenths and the held-out tenth",
                         "use a longer text or a smaller block_size");
    return corpus;
  }

}  // namespace dtrain::models

DTRAIN_IMPL_END
