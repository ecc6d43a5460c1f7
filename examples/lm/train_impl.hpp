#pragma once
// train_lm's training function for one device, included by train_host.cpp
// and train_cuda.cu.

#include <array>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "common/windows.hpp"
#include "lm.hpp"

#include <dtrain/train/generate.hpp>

namespace lm {

// DPO's reference (objective=dpo): each micro-batch gains "ref_logps", the
// reference's log-probability of every sequence's completion, before the
// step: the policy with its adapters off (reference=base), or a frozen
// copy in a trainer of its own, built with the policy's strategy so FSDP
// shards it alike (reference=copy); reference=data has them in the batch.
template <class Trainer>
class Reference {
 public:
  Reference(const Config& c, Trainer*& policy, std::optional<Trainer>& copy)
      : mode_(c.reference), policy_(policy), copy_(copy) {}

  // Collective: every rank's with its own micro-batches.
  void add(std::span<dtrain::Batch> micro) {
    if (mode_ == "data") return;
    for (dtrain::Batch& b : micro) {
      const dtrain::nn::SequenceLogps l =
          copy_ ? copy_->sequence_logps(b) : policy_->sequence_logps(b, {.adapters = false});
      b.set("ref_logps", dtrain::HostTensor::of(l.logp, {static_cast<std::int64_t>(l.logp.size())}));
    }
  }

 private:
  std::string mode_;
  Trainer*& policy_;
  std::optional<Trainer>& copy_;
};

// The DPO loss over the held-out pairs, eval_batches batches of batch_size
// pairs per rank, and TRL's reward figures beside it.
template <class Trainer, class Ref>
void held_out_dpo(const Config& c, dtrain::World& world, const Samples& held_out, Trainer& trainer, Ref& reference) {
  if (c.eval_batches < 1 || held_out.size() < 1) return;
  std::vector<dtrain::Batch> batches;
  std::int64_t next = world.rank();
  for (std::int64_t k = 0; k < c.eval_batches; ++k) {
    std::vector<std::int64_t> idx;
    for (std::int64_t i = 0; i < c.batch_size; ++i, next += world.size()) idx.push_back(next % held_out.size());
    batches.push_back(held_out.gather(idx));
  }
  reference.add(batches);
  const dtrain::EvalResult r = trainer.evaluate(batches);
  if (world.rank() != 0) return;
  std::printf("eval: held-out loss %.4f (DPO, loss_type=%s) over %lld pairs", r.loss, c.loss_type.c_str(),
              static_cast<long long>(c.eval_batches * c.batch_size * world.size()));
  for (const auto& [name, v] : r.metrics) std::printf(" | %s %.4f", name.c_str(), v);
  std::printf("\n");
}

template <class Dev>
int train(const Config& c, dtrain::World& world, const dtrain::hf::LmConfig& config, const Tokens& tokens) {
  return examples::with_precision(c, [&]<class Prec>() {
    using Trainer = dtrain::TrainerCore<dtrain::hf::CausalLm, Dev, Prec>;
    dtrain::hf::CausalLm model(config, c.lora());
    if (c.dpo())
      model.loss = dtrain::nn::PreferenceLoss({.type = dtrain::nn::preference_loss_named(c.loss_type),
                                               .beta = c.beta,
                                               .label_smoothing = c.label_smoothing});
    const Samples train(tokens, c.block_size, true), held_out(tokens, c.block_size, false);
    Trainer* policy = nullptr;
    std::optional<dtrain::hf::CausalLm> ref_model;
    std::optional<Trainer> ref_copy;
    Reference<Trainer> reference(c, policy, ref_copy);
    dtrain::FitCallbacks extra;
    if (c.dpo()) extra.prepare_batches = [&](std::int64_t, std::span<dtrain::Batch> micro) { reference.add(micro); };
    const auto start = [&](Trainer& trainer) {
      policy = &trainer;
      if (c.dpo() && c.reference == "copy") {  // frozen, no optimizer state; the policy's strategy and precision
        ref_model.emplace(dtrain::hf::read_config(c.ref_model), dtrain::hf::LoraConfig{}, false);
        dtrain::TrainerOptions o = examples::trainer_options(c);
        o.param_groups.clear();  // nothing trains: no optimizer, no optimizer state to offload
        if (o.offload == dtrain::offload_kind::optimizer) o.offload = dtrain::offload_kind::none, o.offload_dir.clear();
        ref_copy.emplace(world, *ref_model, dtrain::SGD{.lr = c.lr}, o, 1, examples::strategy_for<Dev, Prec>(c));
        dtrain::hf::load_pretrained(*ref_copy, c.ref_model, ref_model->config);
        if (!c.init_from.empty() && c.ref_model == c.model)
          ref_copy->load_params(c.init_from, {.strict = c.init_strict});
      }
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
    const auto finish = [&](Trainer& trainer) {
      if (c.dpo())
        held_out_dpo(c, world, held_out, trainer, reference);
      else
        examples::held_out_loss(world, held_out, tokens.sft() ? 1 : c.block_size, c.batch_size, c.eval_batches, trainer,
                                tokens.sft() ? "one record" : std::to_string(c.block_size) + " tokens");
      if (c.generate > 0) {
        std::vector<std::int64_t> prompt = c.prompt;
        if (prompt.empty() && tokens.dpo()) {  // the first held-out pair's prompt
          const auto& p = tokens.pairs[static_cast<std::size_t>(tokens.split)].prompt;
          prompt.assign(p.begin(), p.end());
        } else if (prompt.empty() && tokens.sft()) {  // the first held-out record's prompt
          const Record& r = tokens.records[static_cast<std::size_t>(tokens.split)];
          for (std::size_t t = 0; t < r.x.size(); ++t) {  // up to the token that predicts the first target
            prompt.push_back(r.x[t]);
            if (r.y[t] != -100) break;
          }
        } else if (prompt.empty()) {
          prompt.assign(tokens.ids.begin() + tokens.split, tokens.ids.begin() + tokens.split + 8);
        }
        const bool sample = c.temperature > 0.f || c.top_k > 0 || c.top_p < 1.f;
        dtrain::GenerateOptions o{.max_new_tokens = c.generate,
                                  .temperature = sample ? (c.temperature > 0.f ? c.temperature : 1.f) : 0.f,
                                  .top_k = c.top_k,
                                  .top_p = c.top_p,
                                  .stop_tokens = c.stop,
                                  .seed = c.seed,
                                  .max_positions = config.max_position_embeddings};
        // Every rank continues the same prompt (record 0): the same tokens on each.
        const std::vector<std::vector<std::int64_t>> prompts{prompt};
        const dtrain::GenerateResult out = dtrain::generate(trainer, std::span(prompts), {}, o);
        if (world.rank() == 0) {
          std::printf("generate (%s):", sample ? "sampled" : "greedy");
          for (const auto id : prompt) std::printf(" %lld", static_cast<long long>(id));
          std::printf(" |");
          for (const auto id : out.tokens[0]) std::printf(" %lld", static_cast<long long>(id));
          std::printf("\ngenerate: %lld new tokens in %.3f s (%.1f tokens/s, key-value cache)\n",
                      static_cast<long long>(out.new_tokens), out.seconds,
                      static_cast<double>(out.new_tokens) / out.seconds);
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
    return examples::run_training<Dev, Prec>(c, world, model, train, start, finish, extra);
  });
}

}  // namespace lm
