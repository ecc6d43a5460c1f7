#pragma once
// train_lm's training function for one device, included by train_host.cpp
// and train_cuda.cu.

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "common/windows.hpp"
#include "lm.hpp"

namespace lm {

template <class Dev>
int train(const Config& c, dtrain::World& world, const dtrain::hf::LmConfig& config, const Tokens& tokens) {
  return examples::with_precision(c, [&]<class Prec>() {
    dtrain::hf::CausalLm model(config, c.lora());
    const Samples train(tokens, c.block_size, true), held_out(tokens, c.block_size, false);
    const auto start = [&](auto& trainer) {
      if (c.model.empty()) return;
      const double before = peak_rss_mib();
      const auto r = dtrain::hf::load_pretrained(trainer, c.model, config);
      // What loading cost each rank: its peak resident set before and after
      // (each rank maps the files and reads only the elements it owns).
      const auto all = world.all_gather("train-lm-load-rss", std::array{before, peak_rss_mib()});
      if (world.rank() == 0) {
        std::printf(
            "model %s: loaded %zu tensor(s), %.1f MiB of files; peak resident set per rank after loading "
            "(before):",
            c.model.c_str(), r.loaded.size(), checkpoint_mib(c.model));
        for (std::size_t i = 0; i < all.size(); ++i)
          std::printf("%s rank %zu %.0f MiB (%.0f)", i ? "," : "", i, all[i][1], all[i][0]);
        std::printf("\n");
      }
      if (c.adapter.empty()) return;
      const auto a = dtrain::hf::load_adapter(trainer, c.adapter, model);
      if (world.rank() != 0) return;
      std::printf("adapter %s: loaded %zu tensor(s)\n", c.adapter.c_str(), a.loaded.size());
    };
    const auto finish = [&](auto& trainer) {
      examples::held_out_loss(world, held_out, tokens.sft() ? 1 : c.block_size, c.batch_size, c.eval_batches, trainer,
                              tokens.sft() ? "one record" : std::to_string(c.block_size) + " tokens");
      if (c.generate > 0) {
        std::vector<std::int64_t> prompt = c.prompt;
        if (prompt.empty() && tokens.sft()) {  // the first held-out record's prompt
          const Record& r = tokens.records[static_cast<std::size_t>(tokens.split)];
          for (std::size_t t = 0; t < r.x.size(); ++t) {  // up to the token that predicts the first target
            prompt.push_back(r.x[t]);
            if (r.y[t] != -100) break;
          }
        } else if (prompt.empty()) {
          prompt.assign(tokens.ids.begin() + tokens.split, tokens.ids.begin() + tokens.split + 8);
        }
        const auto out =
            generate(trainer, prompt, c.generate, c.top_k, config.max_position_embeddings, config.vocab_size, c.seed);
        if (world.rank() == 0) {
          std::printf("generate (%s):", c.top_k > 0 ? ("top-" + std::to_string(c.top_k)).c_str() : "greedy");
          for (std::size_t i = 0; i < out.size(); ++i)
            std::printf("%s %lld", i == prompt.size() ? " |" : "", static_cast<long long>(out[i]));
          std::printf("\n");
        }
      }
      if (!c.save_adapter.empty()) {
        dtrain::hf::save_adapter(trainer, c.save_adapter, model, c.model);
        if (world.rank() == 0) std::printf("saved the adapters for PEFT: %s\n", c.save_adapter.c_str());
      }
      if (c.save_hf.empty()) return;
      dtrain::hf::save_pretrained(trainer, c.save_hf, model);  // adapters merged into their weights
      if (world.rank() == 0) std::printf("saved the model as a transformers directory: %s\n", c.save_hf.c_str());
    };
    return examples::run_training<Dev, Prec>(c, world, model, train, start, finish);
  });
}

}  // namespace lm
