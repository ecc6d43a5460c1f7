#pragma once
// dtrain::generate: continues prompts with a trained causal language model
// (hf::CausalLm, or any model whose only units that mix positions are
// dtrain's causal attentions), on every rank at once, each rank its own
// prompts:
//
//   const dtrain::GenerateResult r = dtrain::generate(trainer, prompts, record_ids,
//                                                     {.max_new_tokens = 64, .temperature = 0.7f, .top_p = 0.9f});
//
// With the key-value cache (the default) the prompts go through the model
// once, right-padded into one batch, and each later step feeds only the
// newest token of every sequence (nn/kv_cache.hpp); without it
// (cache = false) every step is a full forward over all tokens so far, the
// reference the cache must equal. Greedy (temperature 0: the likeliest
// token, the lowest id among equals) or sampled: logits / temperature, then
// the top_k likeliest, then the fewest likeliest whose probabilities reach
// top_p, each draw from a stream of (seed, the record's id, the step), so a
// record gets the same tokens at any world size and batch. A sequence ends
// after a stop token (kept) or max_new_tokens.
//
// Collective: every rank calls it, with its own prompts (possibly none).
// Under a sharded strategy every forward gathers the parameters unit by
// unit as a training forward does (FSDP: each step's forward gathers every
// unit and frees it after use; nothing stays gathered between steps), so
// the ranks run the same number of steps: until no rank has a sequence
// left, which they agree on after each step (one all-gather).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/tensor.hpp"

namespace dtrain {

struct GenerateOptions {
  std::int64_t max_new_tokens = 32;
  float temperature = 0.f;                  // 0: greedy; > 0: sample from softmax(logits / temperature)
  std::int64_t top_k = 0;                   // > 0: sample among the k likeliest only
  float top_p = 1.f;                        // < 1: among the fewest likeliest whose probabilities reach top_p
  std::vector<std::int64_t> stop_tokens{};  // a sequence ends after one of these (kept in its tokens)
  std::uint64_t seed = 0;                   // the sampling streams' root
  bool cache = true;                        // false: a full forward over every token at each step
  bool adapters = true;                     // false: the base model (LoRA adapters off)
  std::int64_t max_positions = 0;           // > 0: a prompt and its new tokens may not be longer
  std::int64_t pad_id = 0;                  // the id padding positions hold (never attended by real tokens)
};

struct GenerateResult {
  std::vector<std::vector<std::int64_t>> tokens;  // per prompt: its new tokens
  std::int64_t new_tokens = 0;                    // on this rank
  std::int64_t steps = 0;                         // forwards, the same on every rank
  double seconds = 0;                             // the call's wall time on this rank
};

namespace detail {

// The token that follows `logits` (one row of the vocabulary) under `o`,
// drawing from `stream`.
inline std::int64_t next_token(std::span<const float> logits, const GenerateOptions& o, std::uint64_t stream) {
  const auto vocab = static_cast<std::int64_t>(logits.size());
  std::vector<std::int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  const auto likelier = [&](std::int64_t a, std::int64_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
           (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
  };
  if (o.temperature == 0.f) return *std::min_element(order.begin(), order.end(), likelier);
  const std::int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), likelier);
  const double top = logits[static_cast<std::size_t>(order[0])];
  std::vector<double> w(static_cast<std::size_t>(k));
  double total = 0;
  for (std::int64_t i = 0; i < k; ++i)
    total += w[static_cast<std::size_t>(i)] =
        std::exp((static_cast<double>(logits[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])]) - top) /
                 o.temperature);
  std::int64_t keep = k;
  if (o.top_p < 1.f) {  // the nucleus: the fewest likeliest whose share reaches top_p (at least one)
    double mass = 0;
    for (keep = 0; keep < k && (keep == 0 || mass < o.top_p * total);) mass += w[static_cast<std::size_t>(keep++)];
    total = mass;
  }
  double u = static_cast<double>(derive_stream(stream, 0) >> 11) * 0x1.0p-53 * total;
  for (std::int64_t i = 0; i < keep; ++i)
    if ((u -= w[static_cast<std::size_t>(i)]) < 0) return order[static_cast<std::size_t>(i)];
  return order[static_cast<std::size_t>(keep - 1)];
}

inline void check_generate(std::span<const std::vector<std::int64_t>> prompts, std::span<const std::uint64_t> records,
                           const GenerateOptions& o) {
  if (o.max_new_tokens < 1 || !(o.temperature >= 0.f) || o.top_k < 0 || !(o.top_p > 0.f && o.top_p <= 1.f))
    throw config_error("generate: max_new_tokens " + std::to_string(o.max_new_tokens) + ", temperature " +
                           std::to_string(o.temperature) + ", top_k " + std::to_string(o.top_k) + ", top_p " +
                           std::to_string(o.top_p),
                       "give max_new_tokens >= 1, temperature >= 0 (0: greedy), top_k >= 0 (0: all), top_p in (0, 1]");
  if (!records.empty() && records.size() != prompts.size())
    throw config_error("generate: " + std::to_string(records.size()) + " record ids for " +
                           std::to_string(prompts.size()) + " prompts",
                       "give one id per prompt (its sampling stream), or none (the prompts' indices)");
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      throw config_error("generate: prompt " + std::to_string(i) + " is empty", "give every prompt a token at least");
    const auto n = static_cast<std::int64_t>(prompts[i].size()) + o.max_new_tokens;
    if (o.max_positions > 0 && n > o.max_positions)
      throw config_error("generate: prompt " + std::to_string(i) + " (" + std::to_string(prompts[i].size()) +
                             " tokens) and " + std::to_string(o.max_new_tokens) + " new tokens are longer than the " +
                             std::to_string(o.max_positions) + " positions of the model",
                         "shorten the prompt or lower max_new_tokens to " +
                             std::to_string(o.max_positions - static_cast<std::int64_t>(prompts[i].size())));
  }
}

}  // namespace detail

template <class Trainer>
GenerateResult generate(Trainer& trainer, std::span<const std::vector<std::int64_t>> prompts,
                        std::span<const std::uint64_t> records, const GenerateOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  detail::check_generate(prompts, records, o);
  World& world = trainer.world();
  const auto B = static_cast<std::int64_t>(prompts.size());
  std::vector<std::vector<std::int64_t>> seq(prompts.begin(), prompts.end());  // every token so far
  GenerateResult r;
  r.tokens.resize(prompts.size());
  std::vector<char> done(prompts.size(), 0);
  std::int64_t capacity = 1;
  for (const auto& p : prompts) capacity = std::max(capacity, static_cast<std::int64_t>(p.size()) + o.max_new_tokens);
  // Forward over `fed` new tokens per sequence (the cache's), or over all
  // (without it): the logits of each sequence's last token.
  const auto last_logits = [&](bool first) {
    const std::int64_t n = !o.cache || first
                               ? std::accumulate(seq.begin(), seq.end(), std::int64_t{1},
                                                 [](std::int64_t m, const auto& s) {
                                                   return std::max(m, static_cast<std::int64_t>(s.size()));
                                                 })
                               : 1;
    std::vector<std::int64_t> x(static_cast<std::size_t>(B * n), o.pad_id), pos(x.size(), 0), rows;
    for (std::int64_t b = 0; b < B; ++b) {
      const auto& s = seq[static_cast<std::size_t>(b)];
      const auto len = static_cast<std::int64_t>(s.size());
      if (n == 1 && !first) {  // the newest token, at its position
        x[static_cast<std::size_t>(b)] = s.back();
        pos[static_cast<std::size_t>(b)] = len - 1;
        rows.push_back(b);
        continue;
      }
      for (std::int64_t t = 0; t < n; ++t) {
        if (t < len) x[static_cast<std::size_t>(b * n + t)] = s[static_cast<std::size_t>(t)];
        pos[static_cast<std::size_t>(b * n + t)] = t;
      }
      rows.push_back(b * n + len - 1);
    }
    Batch batch;
    batch.set("x", HostTensor::of(x, {B, n}));
    if (o.cache) batch.set("position_ids", HostTensor::of(pos, {B, n}));
    ++r.steps;
    return trainer.decode(batch, rows, {.adapters = o.adapters, .cache_positions = o.cache ? capacity : 0});
  };
  for (bool first = true;; first = false) {
    const std::vector<float> logits = last_logits(first);
    const std::size_t vocab = B > 0 ? logits.size() / static_cast<std::size_t>(B) : 0;
    bool live = false;
    for (std::int64_t b = 0; b < B; ++b) {
      const auto i = static_cast<std::size_t>(b);
      if (done[i]) continue;
      const std::uint64_t record = records.empty() ? static_cast<std::uint64_t>(b) : records[i];
      const std::int64_t next = detail::next_token(
          std::span(logits).subspan(i * vocab, vocab), o,
          detail::derive_stream(detail::derive_stream(o.seed, record), static_cast<std::uint64_t>(r.tokens[i].size())));
      r.tokens[i].push_back(next);
      seq[i].push_back(next);
      ++r.new_tokens;
      done[i] = static_cast<std::int64_t>(r.tokens[i].size()) >= o.max_new_tokens ||
                std::find(o.stop_tokens.begin(), o.stop_tokens.end(), next) != o.stop_tokens.end();
      live = live || !done[i];
    }
    // (a finished sequence is fed its last token again at its last position,
    // rewriting its cache slot with the same values, while others go on)
    bool any = live;
    if (world.size() > 1)
      for (const std::uint8_t v : world.all_gather("generate", static_cast<std::uint8_t>(live))) any = any || v != 0;
    if (!any) break;
  }
  trainer.release_kv_cache();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace dtrain
