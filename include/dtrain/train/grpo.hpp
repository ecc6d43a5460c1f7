#pragma once
// GRPO (group relative policy optimisation) as TRL's GRPOTrainer runs it:
// for each prompt, num_generations completions sampled from the current
// policy (dtrain::generate), each scored by a reward function, the rewards
// normalised within each prompt's group into advantages, and the policy
// trained with nn::GrpoLoss on those completions. grpo_batch makes one
// micro-batch of it:
//
//   const dtrain::GrpoBatch b = dtrain::grpo_batch(trainer, prompts, prompt_ids,
//                                                  dtrain::rewards::token_count(42), {.num_generations = 8}, step);
//   trainer.step(std::span(&b.batch, 1));
//
// A reward is any callable (prompt ids, completion ids) -> double; two
// ship here: a target token's count, and a regular expression over the
// completion decoded with a vocabulary file.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/io/json.hpp"
#include "dtrain/train/generate.hpp"

namespace dtrain {

// The score of one completion of a prompt (token ids).
using RewardFunction =
    std::function<double(std::span<const std::int64_t> prompt, std::span<const std::int64_t> completion)>;

namespace rewards {

// How many times `token` occurs in the completion.
inline RewardFunction token_count(std::int64_t token) {
  return [token](std::span<const std::int64_t>, std::span<const std::int64_t> completion) {
    return static_cast<double>(std::count(completion.begin(), completion.end(), token));
  };
}

// The largest vocabulary read_vocabulary takes: ids are dense in a
// tokenizer's vocabulary, and one far beyond would only size the table.
inline constexpr std::int64_t max_vocabulary_id = std::int64_t{1} << 24;

// A tokenizer's vocabulary, id -> text: a JSON object {"text": id, ...}
// (a tokenizer's vocab.json) or a text file of one token per line (line i
// is id i).
inline std::vector<std::string> read_vocabulary(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in)
    throw config_error("cannot read the vocabulary '" + file.string() + "'",
                       "give a vocab.json ({\"text\": id}) or a text file of one token per line");
  std::vector<std::string> vocab;
  if (file.extension() == ".json") {
    const auto j = detail::parse_json<nlohmann::json>(in, [&](const std::string& problem) {
      return config_error("the vocabulary '" + file.string() + "' is " + problem,
                          "give a vocab.json ({\"text\": id}) or a text file of one token per line");
    });
    if (!j.is_object())
      throw config_error("the vocabulary '" + file.string() + "' is not a JSON object of {\"text\": id}",
                         "give a tokenizer's vocab.json");
    for (const auto& [text, id] : j.items()) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0)
        throw config_error("the vocabulary '" + file.string() + "' maps '" + text + "' to " + id.dump(),
                           "give non-negative integer ids");
      if (id.get<std::int64_t>() >= max_vocabulary_id)
        throw config_error("the vocabulary '" + file.string() + "' maps '" + text + "' to " + id.dump() +
                               ", beyond the " + std::to_string(max_vocabulary_id) + " ids dtrain reads",
                           "give a tokenizer's vocab.json, whose ids count up from 0");
      const auto i = static_cast<std::size_t>(id.get<std::int64_t>());
      if (vocab.size() <= i) vocab.resize(i + 1);
      vocab[i] = text;
    }
    return vocab;
  }
  for (std::string line; std::getline(in, line);) vocab.push_back(line);
  return vocab;
}

// 1 when the completion, decoded token by token with `vocabulary`,
// contains a match of `pattern` (ECMAScript syntax), else 0. An id outside
// the vocabulary decodes to nothing.
inline RewardFunction regex_match(const std::string& pattern, std::vector<std::string> vocabulary) {
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw config_error("the reward's regular expression '" + pattern + "' does not compile (" + e.what() + ")",
                       "give an ECMAScript regular expression, e.g. regex:[0-9]+");
  }
  return [re = std::move(re), vocab = std::move(vocabulary)](std::span<const std::int64_t>,
                                                             std::span<const std::int64_t> completion) {
    std::string text;
    for (const auto id : completion)
      if (id >= 0 && static_cast<std::size_t>(id) < vocab.size()) text += vocab[static_cast<std::size_t>(id)];
    return std::regex_search(text, re) ? 1.0 : 0.0;
  };
}

}  // namespace rewards

// TRL's advantages (scale_rewards "group"): each reward minus its group's
// mean, over the group's standard deviation (Bessel's correction) plus
// 1e-4; a group is num_generations consecutive completions. A non-finite
// reward leaves its group's advantages non-finite (the step's loss then
// is, and the trainer's non-finite policy acts).
inline std::vector<double> group_advantages(std::span<const double> rewards, std::int64_t num_generations) {
  const auto g = static_cast<std::size_t>(num_generations);
  if (num_generations < 2 || rewards.size() % g != 0)
    throw config_error("group_advantages: " + std::to_string(rewards.size()) + " rewards in groups of " +
                           std::to_string(num_generations),
                       "give num_generations >= 2 completions per prompt, whole groups");
  std::vector<double> out(rewards.size());
  for (std::size_t first = 0; first < rewards.size(); first += g) {
    double mean = 0, var = 0;
    for (std::size_t i = 0; i < g; ++i) mean += rewards[first + i];
    mean /= static_cast<double>(g);
    for (std::size_t i = 0; i < g; ++i) var += (rewards[first + i] - mean) * (rewards[first + i] - mean);
    const double std = std::sqrt(var / static_cast<double>(g - 1));
    for (std::size_t i = 0; i < g; ++i) out[first + i] = (rewards[first + i] - mean) / (std + 1e-4);
  }
  return out;
}

// The training batch of completions: sequence i is prompts[i] followed by
// completions[i], right-padded with pad_id to the longest; "x" the ids but
// the last, "y" the next ids on the completion only (-100 elsewhere),
// "advantages" [B] and "rewards" [B] (f64).
inline Batch completion_batch(std::span<const std::vector<std::int64_t>> prompts,
                              std::span<const std::vector<std::int64_t>> completions,
                              std::span<const double> advantages, std::span<const double> rewards,
                              std::int64_t pad_id = 0) {
  const auto n = static_cast<std::int64_t>(prompts.size());
  if (completions.size() != prompts.size() || advantages.size() != prompts.size() ||
      (!rewards.empty() && rewards.size() != prompts.size()))
    throw config_error("completion_batch: " + std::to_string(prompts.size()) + " prompts, " +
                           std::to_string(completions.size()) + " completions, " + std::to_string(advantages.size()) +
                           " advantages",
                       "give one completion and one advantage per prompt (a prompt repeated per completion)");
  std::int64_t time = 1;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty() || completions[i].empty())
      throw config_error("completion_batch: sequence " + std::to_string(i) + " has an empty prompt or completion",
                         "give every prompt and completion a token at least");
    time = std::max<std::int64_t>(time, static_cast<std::int64_t>(prompts[i].size() + completions[i].size()) - 1);
  }
  std::vector<std::int64_t> x(static_cast<std::size_t>(n * time), pad_id), y(x.size(), -100);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& p = prompts[static_cast<std::size_t>(i)];
    std::vector<std::int64_t> ids(p);
    ids.insert(ids.end(), completions[static_cast<std::size_t>(i)].begin(),
               completions[static_cast<std::size_t>(i)].end());
    for (std::size_t t = 0; t + 1 < ids.size(); ++t) {
      x[static_cast<std::size_t>(i * time) + t] = ids[t];
      if (t + 1 >= p.size()) y[static_cast<std::size_t>(i * time) + t] = ids[t + 1];
    }
  }
  Batch b;
  b.set("x", HostTensor::of(x, {n, time}));
  b.set("y", HostTensor::of(y, {n, time}));
  b.set("advantages", HostTensor::of(std::vector<double>(advantages.begin(), advantages.end()), {n}));
  if (!rewards.empty()) b.set("rewards", HostTensor::of(std::vector<double>(rewards.begin(), rewards.end()), {n}));
  return b;
}

struct GrpoOptions {
  std::int64_t num_generations = 8;  // completions per prompt (TRL's default 8)
  // How they are sampled (TRL's: temperature 1); seed and max_new_tokens
  // as in dtrain::generate.
  GenerateOptions generation{.max_new_tokens = 16, .temperature = 1.f};
};

struct GrpoBatch {
  Batch batch;                         // completion_batch's, for nn::GrpoLoss
  std::vector<double> rewards;         // per completion
  std::vector<std::string> nonfinite;  // which completions' rewards were not finite
  GenerateResult generation;           // the sampling's tokens and time
};

// One GRPO micro-batch: for each prompt num_generations completions from
// the trainer's current policy, sampled from the streams of (seed, step,
// prompt id x num_generations + k) (so the same at any world size), scored
// by `reward`, and their group advantages. Collective (dtrain::generate).
template <class Trainer>
GrpoBatch grpo_batch(Trainer& trainer, std::span<const std::vector<std::int64_t>> prompts,
                     std::span<const std::uint64_t> prompt_ids, const RewardFunction& reward, const GrpoOptions& o,
                     std::int64_t step) {
  const auto g = static_cast<std::size_t>(o.num_generations);
  if (o.num_generations < 2)
    throw config_error("grpo: num_generations " + std::to_string(o.num_generations) + " is below 2",
                       "give at least 2 completions per prompt: their rewards are compared within the group");
  if (prompt_ids.size() != prompts.size())
    throw config_error(
        "grpo_batch: " + std::to_string(prompt_ids.size()) + " ids for " + std::to_string(prompts.size()) + " prompts",
        "give one id per prompt");
  std::vector<std::vector<std::int64_t>> repeated;
  std::vector<std::uint64_t> records;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    for (std::size_t k = 0; k < g; ++k) {
      repeated.push_back(prompts[i]);
      records.push_back(prompt_ids[i] * g + k);
    }
  GenerateOptions gen = o.generation;
  gen.seed = detail::derive_stream(o.generation.seed, static_cast<std::uint64_t>(step));
  GrpoBatch out;
  out.generation = generate(trainer, std::span<const std::vector<std::int64_t>>(repeated), std::span(records), gen);
  for (std::size_t i = 0; i < repeated.size(); ++i) {
    const double r = reward(repeated[i], out.generation.tokens[i]);
    if (!std::isfinite(r))
      out.nonfinite.push_back("prompt " + std::to_string(prompt_ids[i / g]) + ", completion " + std::to_string(i % g) +
                              ": reward " + std::to_string(r));
    out.rewards.push_back(r);
  }
  const std::vector<double> adv = group_advantages(out.rewards, o.num_generations);
  out.batch = completion_batch(repeated, out.generation.tokens, adv, out.rewards, o.generation.pad_id);
  return out;
}

}  // namespace dtrain
