#pragma once
// train_gpt's training function for one device, included by train_host.cpp
// and train_cuda.cu.

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "gpt.hpp"

namespace gpt {

template <class Dev>
int train(const Config& c, dtrain::World& world, const Corpus& corpus) {
  return examples::with_precision(c, [&]<class Prec>() {
    Model model(corpus.tokenizer.vocab(), c.block_size, c.n_layer, c.n_head, c.n_embd);
    const Windows train(corpus.tokens, c.block_size, 0, corpus.split);
    return examples::run_training<Dev, Prec>(c, world, model, train, [&](auto& trainer) {
      examples::held_out_loss(world, corpus.tokens, corpus.split, c.block_size, c.batch_size, c.eval_batches, trainer);
    });
  });
}

}  // namespace gpt
