#pragma once
// train_gpt's training function for one device, included by train_host.cpp
// and train_cuda.cu.

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "gpt.hpp"

namespace gpt {

// The held-out loss: eval_batches batches per rank of non-overlapping windows
// from the last tenth of the text, every rank its own.
template <class Trainer>
void evaluate(const Config& c, dtrain::World& world, const Corpus& corpus, Trainer& trainer) {
  if (c.eval_batches < 1) return;
  const Windows held_out(corpus.tokens, c.block_size, corpus.split, static_cast<std::int64_t>(corpus.tokens.size()));
  std::vector<dtrain::Batch> batches;
  std::int64_t next = world.rank() * c.block_size;
  for (std::int64_t k = 0; k < c.eval_batches; ++k) {
    std::vector<std::int64_t> idx;
    for (std::int64_t i = 0; i < c.batch_size; ++i) {
      idx.push_back(next % held_out.size());
      next += world.size() * c.block_size;
    }
    batches.push_back(held_out.gather(idx));
  }
  const double loss = trainer.evaluate(batches);
  if (world.rank() == 0)
    std::printf("eval: held-out loss %.4f (perplexity %.2f) over %lld tokens\n", loss, std::exp(loss),
                static_cast<long long>(c.eval_batches * c.batch_size * c.block_size * world.size()));
}

template <class Dev>
int train(const Config& c, dtrain::World& world, const Corpus& corpus) {
  return examples::with_precision(c, [&]<class Prec>() {
    Model model(corpus.tokenizer.vocab(), c.block_size, c.n_layer, c.n_head, c.n_embd);
    const Windows train(corpus.tokens, c.block_size, 0, corpus.split);
    return examples::run_training<Dev, Prec>(c, world, model, train,
                                             [&](auto& trainer) { evaluate(c, world, corpus, trainer); });
  });
}

}  // namespace gpt
