#pragma once
// train_lm's training function for one device, included by train_host.cpp
// and train_cuda.cu.

#include <algorithm>
#include <array>
#include <chrono>
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
#include <dtrain/train/grpo.hpp>

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
      : mode_(c.reference), per_token_(c.grpo()), policy_(policy), copy_(copy) {}

  // Collective: every rank's with its own micro-batches. GRPO's reference
  // is per token ([B, T]), DPO's per sequence ([2P]).
  void add(std::span<dtrain::Batch> micro) {
    if (mode_ == "data" || mode_ == "none") return;
    const auto start = std::chrono::steady_clock::now();
    struct Timed {
      std::vector<double>& ms;
      std::chrono::steady_clock::time_point start;
      ~Timed() {
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
    } timed{ms_, start};
    for (dtrain::Batch& b : micro) {
      const dtrain::nn::SequenceLogps l =
          copy_ ? copy_->sequence_logps(b) : policy_->sequence_logps(b, {.adapters = false});
      if (per_token_)
        b.set("ref_logps", dtrain::HostTensor::of(l.row_logp, b.at("y").shape));
      else
        b.set("ref_logps", dtrain::HostTensor::of(l.logp, {static_cast<std::int64_t>(l.logp.size())}));
    }
  }

  // The median time computing the reference's log-probabilities per call.
  void report() const {
    if (ms_.empty()) return;
    std::vector<double> v = ms_;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    std::printf("reference log-probabilities (%s): median %.2f ms per step, %zu steps\n", mode_.c_str(),
                v[v.size() / 2], v.size());
  }

 private:
  std::vector<double> ms_;
  std::string mode_;
  bool per_token_;
  Trainer*& policy_;
  std::optional<Trainer>& copy_;
};

// The DPO loss over the held-out pairs, eval_batches batches of batch_size
// pairs per rank, and TRL's reward figures beside it.
template <class Trainer, class Ref>
void held_out_dpo(const Config& c, dtrain::World& world, const Samples& held_out, Trainer& trainer, Ref& reference) {
  if (c.eval_batches < 1 || held_out.size() < 1) return;
  auto batches = examples::held_out_batches(world, held_out, 1, c.batch_size, c.eval_batches);
  reference.add(batches);
  const dtrain::EvalResult r = trainer.evaluate(batches);
  if (world.rank() != 0) return;
  std::printf("eval: held-out loss %.4f (DPO, loss_type=%s) over %lld pairs", r.loss, c.loss_type.c_str(),
              static_cast<long long>(c.eval_batches * c.batch_size * world.size()));
  for (const auto& [name, v] : r.metrics) std::printf(" | %s %.4f", name.c_str(), v);
  std::printf("\n");
}

// The reward train_lm's reward= names.
inline dtrain::RewardFunction reward_named(const Config& c) {
  if (c.reward.starts_with("token:")) {
    std::int64_t id = -1;
    try {
      id = std::stoll(c.reward.substr(6));
    } catch (const std::exception&) {
    }
    if (id < 0)
      throw dtrain::config_error("reward=" + c.reward + " names no token id", "give reward=token:ID, e.g. token:42");
    return dtrain::rewards::token_count(id);
  }
  return dtrain::rewards::regex_match(c.reward.substr(6), dtrain::rewards::read_vocabulary(c.vocab_file));
}

// GRPO's micro-batches (objective=grpo): each holds prompt indices; before
// the step they become the prompts' sampled completions with their
// advantages (train/grpo.hpp), and with beta > 0 the reference's per-token
// log-probabilities. A completion whose reward is not finite is named
// here; its group's loss is then not finite and on_nonfinite acts.
template <class Trainer, class Ref>
class GrpoSource {
 public:
  GrpoSource(const Config& c, dtrain::World& world, const Tokens& t, Trainer*& policy, Ref& reference)
      : c_(c), world_(world), t_(t), policy_(policy), reference_(reference) {
    if (c.grpo()) reward_ = reward_named(c);
  }

  // Collective.
  dtrain::GrpoBatch sample(const std::vector<std::int64_t>& indices, std::int64_t step) {
    std::vector<std::vector<std::int64_t>> prompts;
    std::vector<std::uint64_t> ids;
    for (const auto i : indices) {
      prompts.push_back(t_.prompts[static_cast<std::size_t>(i)]);
      ids.push_back(static_cast<std::uint64_t>(i));
    }
    const dtrain::GrpoOptions o{.num_generations = c_.num_generations,
                                .generation = {.max_new_tokens = c_.max_new_tokens,
                                               .temperature = c_.temperature > 0.f ? c_.temperature : 1.f,
                                               .top_k = c_.top_k,
                                               .top_p = c_.top_p,
                                               .stop_tokens = c_.stop,
                                               .seed = c_.seed}};
    dtrain::GrpoBatch b = dtrain::grpo_batch(*policy_, std::span<const std::vector<std::int64_t>>(prompts),
                                             std::span<const std::uint64_t>(ids), reward_, o, step);
    if (step >= 0) sampled_s_ += b.generation.seconds, prompts_ += static_cast<std::int64_t>(indices.size());
    for (const auto& what : b.nonfinite)
      std::printf("grpo: rank %d step %lld: %s: this step's loss is not finite (on_nonfinite acts)\n", world_.rank(),
                  static_cast<long long>(step), what.c_str());
    return b;
  }

  void prepare(std::int64_t step, std::span<dtrain::Batch> micro) {
    for (dtrain::Batch& b : micro) {
      const auto idx = b.at("prompt_index").template values<std::int64_t>();
      b = sample(std::vector<std::int64_t>(idx.begin(), idx.end()), step).batch;
    }
    reference_.add(micro);
  }

  void add_step(double ms) { trained_s_ += ms / 1000.0; }

  // Rank 0's time sampling and training, and the prompts per second over all ranks.
  void report() {
    if (world_.rank() != 0 || prompts_ == 0) return;
    const double all = static_cast<double>(prompts_ * world_.size());
    std::printf(
        "grpo: %lld prompts (%lld completions) over all ranks: sampling %.2f s, training %.2f s: %.2f prompts/s\n",
        static_cast<long long>(all), static_cast<long long>(all) * c_.num_generations, sampled_s_, trained_s_,
        all / (sampled_s_ + trained_s_));
  }

  // The mean reward of held-out prompts' sampled completions, over every rank.
  void held_out(const Samples& held_out) {
    if (c_.eval_batches < 1 || held_out.size() < 1) return;
    double sum = 0, n = 0;
    std::int64_t next = world_.rank();
    for (std::int64_t k = 0; k < c_.eval_batches; ++k) {
      std::vector<std::int64_t> idx;
      for (std::int64_t i = 0; i < c_.batch_size / c_.num_generations; ++i, next += world_.size())
        idx.push_back(t_.split + next % held_out.size());
      for (const double r : sample(idx, -1 - k).rewards) sum += r, n += 1;
    }
    double all_sum = 0, all_n = 0;
    for (const auto& v : world_.all_gather("train-lm-grpo-eval", std::array{sum, n})) all_sum += v[0], all_n += v[1];
    if (world_.rank() == 0)
      std::printf("eval: held-out reward mean %.4f over %lld completions of %lld prompts\n", all_sum / all_n,
                  static_cast<long long>(all_n), static_cast<long long>(all_n) / c_.num_generations);
  }

 private:
  const Config& c_;
  dtrain::World& world_;
  const Tokens& t_;
  Trainer*& policy_;
  Ref& reference_;
  dtrain::RewardFunction reward_;
  double sampled_s_ = 0, trained_s_ = 0;
  std::int64_t prompts_ = 0;
};

template <class Dev>
int train(const Config& c, dtrain::World& world, const dtrain::hf::LmConfig& config, const Tokens& tokens) {
  return examples::with_precision(c, [&]<class Prec>() {
    using Trainer = dtrain::TrainerCore<dtrain::hf::CausalLm, Dev, Prec>;
    dtrain::hf::CausalLm model(config, c.lora());
    if (c.grpo())
      model.loss =
          dtrain::nn::GrpoLoss({.epsilon = c.epsilon, .epsilon_high = c.epsilon_high, .beta = c.beta_or_default()});
    if (c.dpo())
      model.loss = dtrain::nn::PreferenceLoss({.type = dtrain::nn::preference_loss_named(c.loss_type),
                                               .beta = c.beta_or_default(),
                                               .label_smoothing = c.label_smoothing});
    const Samples train(tokens, c.block_size, true), held_out(tokens, c.block_size, false);
    Trainer* policy = nullptr;
    std::optional<dtrain::hf::CausalLm> ref_model;
    std::optional<Trainer> ref_copy;
    Reference<Trainer> reference(c, policy, ref_copy);
    GrpoSource<Trainer, Reference<Trainer>> grpo(c, world, tokens, policy, reference);
    dtrain::FitCallbacks extra;
    if (c.dpo()) extra.prepare_batches = [&](std::int64_t, std::span<dtrain::Batch> micro) { reference.add(micro); };
    if (c.grpo()) {
      extra.prepare_batches = [&](std::int64_t step, std::span<dtrain::Batch> micro) { grpo.prepare(step, micro); };
      extra.on_step = [&](const dtrain::StepStats& st, dtrain::FitControl&) { grpo.add_step(st.step_ms); };
    }
    const auto start = [&](Trainer& trainer) {
      policy = &trainer;
      if ((c.dpo() || c.grpo()) &&
          c.reference == "copy") {  // frozen, no optimizer state; the policy's strategy and precision
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
      if (world.rank() == 0) reference.report();  // before the evaluation's calls
      if (c.dpo())
        held_out_dpo(c, world, held_out, trainer, reference);
      else if (c.grpo())
        grpo.report(), grpo.held_out(held_out);
      else
        examples::held_out_loss(world, held_out, tokens.sft() ? 1 : c.block_size, c.batch_size, c.eval_batches, trainer,
                                tokens.sft() ? "one record" : std::to_string(c.block_size) + " tokens");
      if (c.generate > 0) {
        std::vector<std::int64_t> prompt = c.prompt;
        if (prompt.empty() && tokens.grpo()) {  // the first held-out prompt
          prompt = tokens.prompts[static_cast<std::size_t>(tokens.split)];
        } else if (prompt.empty() && tokens.dpo()) {  // the first held-out pair's prompt
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
        // Every rank continues the same prompt (records 0, 1, ...): the same tokens on each.
        const std::vector<std::vector<std::int64_t>> prompts(static_cast<std::size_t>(c.generate_batch), prompt);
        const dtrain::GenerateResult out = dtrain::generate(trainer, std::span(prompts), {}, o);
        if (world.rank() == 0) {
          std::printf("generate (%s):", sample ? "sampled" : "greedy");
          for (const auto id : prompt) std::printf(" %lld", static_cast<long long>(id));
          std::printf(" |");
          for (const auto id : out.tokens[0]) std::printf(" %lld", static_cast<long long>(id));
          std::printf("\ngenerate: %lld new tokens in %.3f s (%.1f tokens/s, batch %lld, key-value cache)\n",
                      static_cast<long long>(out.new_tokens), out.seconds,
                      static_cast<double>(out.new_tokens) / out.seconds, static_cast<long long>(c.generate_batch));
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
    // GRPO's batch_size counts completions (TRL's): a micro-batch is that many
    // over num_generations prompts.
    Config run = c;
    if (c.grpo()) run.batch_size = c.batch_size / c.num_generations;
    return examples::run_training<Dev, Prec>(run, world, model, train, start, finish, extra);
  });
}

}  // namespace lm
