#pragma once
// Language-model samples from a stream of token ids: train_gpt's characters
// and train_lm's tokenizer ids.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <dtrain/comm/world.hpp>
#include <dtrain/core/tensor.hpp>

namespace examples {

// Every window of block_size + 1 tokens starting in [first, last) of the
// token stream, as a data set: sample i is the window at first + i.
class Windows {
 public:
  Windows(std::span<const std::int32_t> tokens, std::int64_t block, std::int64_t first, std::int64_t last)
      : tokens_(tokens), block_(block), first_(first), count_(std::max<std::int64_t>(0, last - first - block)) {}

  std::int64_t size() const { return count_; }

  dtrain::Batch gather(std::span<const std::int64_t> indices) const {
    const auto n = static_cast<std::int64_t>(indices.size());
    std::vector<std::int32_t> x, y;
    x.reserve(static_cast<std::size_t>(n * block_));
    y.reserve(static_cast<std::size_t>(n * block_));
    for (const auto i : indices) {
      const auto at = tokens_.begin() + first_ + i;
      x.insert(x.end(), at, at + block_);
      y.insert(y.end(), at + 1, at + block_ + 1);
    }
    dtrain::Batch b;
    b.set("x", dtrain::HostTensor::of(x, {n, block_}));
    b.set("y", dtrain::HostTensor::of(y, {n, block_}));
    return b;
  }

 private:
  std::span<const std::int32_t> tokens_;
  std::int64_t block_, first_, count_;
};

// This rank's eval_batches batches of batch_size samples of `held_out` (a
// source with size() and gather(indices)): samples `stride` apart, every
// rank its own (rank r starts at r * stride), wrapping around a small set.
// Stride 1 takes every sample; non-overlapping windows take the block size.
template <class Source>
std::vector<dtrain::Batch> held_out_batches(const dtrain::World& world, const Source& held_out, std::int64_t stride,
                                            std::int64_t batch_size, std::int64_t eval_batches) {
  std::vector<dtrain::Batch> batches;
  if (held_out.size() < 1) return batches;
  std::int64_t next = world.rank() * stride;
  for (std::int64_t k = 0; k < eval_batches; ++k) {
    std::vector<std::int64_t> idx;
    for (std::int64_t i = 0; i < batch_size; ++i, next += world.size() * stride) idx.push_back(next % held_out.size());
    batches.push_back(held_out.gather(idx));
  }
  return batches;
}

// The held-out loss, printed by rank 0, over held_out_batches. `unit` names
// what a sample holds, e.g. "64 tokens".
template <class Source, class Trainer>
void held_out_loss(dtrain::World& world, const Source& held_out, std::int64_t stride, std::int64_t batch_size,
                   std::int64_t eval_batches, Trainer& trainer, const std::string& unit) {
  if (eval_batches < 1 || held_out.size() < 1) return;
  const auto batches = held_out_batches(world, held_out, stride, batch_size, eval_batches);
  const double loss = trainer.evaluate(batches).loss;
  if (world.rank() == 0)
    std::printf("eval: held-out loss %.4f (perplexity %.2f) over %lld samples of %s\n", loss, std::exp(loss),
                static_cast<long long>(eval_batches * batch_size * world.size()), unit.c_str());
}

// The same over the windows of tokens [first, end).
template <class Trainer>
void held_out_loss(dtrain::World& world, std::span<const std::int32_t> tokens, std::int64_t first, std::int64_t block,
                   std::int64_t batch_size, std::int64_t eval_batches, Trainer& trainer) {
  const Windows held_out(tokens, block, first, static_cast<std::int64_t>(tokens.size()));
  held_out_loss(world, held_out, block, batch_size, eval_batches, trainer, std::to_string(block) + " tokens");
}

}  // namespace examples
