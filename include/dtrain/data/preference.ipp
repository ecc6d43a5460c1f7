// The definitions preference.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <algorithm>
#include <fstream>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/data/preference.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  inline config_error pair_error(const std::filesystem::path& file, std::int64_t line, const std::string& what,
                                 const std::string& fix) {
    return config_error("preference pairs '" + file.string() + "', line " + std::to_string(line) + ": " + what, fix);
  }

  [[noreturn]] inline void bad_pair(const std::filesystem::path& file, std::int64_t line, const std::string& what,
                                    const std::string& fix) {
    throw pair_error(file, line, what, fix);
  }

  inline std::vector<std::int32_t> pair_ids(const nlohmann::json& j, const char* key, const std::filesystem::path& file,
                                            std::int64_t line, std::int64_t vocab) {
    const std::string shape =
        "give one object per line: {\"prompt_ids\": [...], \"chosen_ids\": [...], "
        "\"rejected_ids\": [...]} of token ids";
    if (!j.contains(key) || !j[key].is_array()) bad_pair(file, line, std::string("no ") + key + " list", shape);
    if (j[key].empty())
      bad_pair(file, line, std::string(key) + " is empty",
               "drop the pair: a pair needs a prompt and two non-empty completions");
    std::vector<std::int32_t> ids;
    ids.reserve(j[key].size());
    for (const auto& v : j[key]) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= vocab)
        bad_pair(file, line,
                 std::string(key) + " holds " + v.dump() + ", not a token id in [0, " + std::to_string(vocab) + ")",
                 "tokenize with the model's tokenizer (its vocabulary has " + std::to_string(vocab) + " ids)");
      ids.push_back(static_cast<std::int32_t>(v.get<std::int64_t>()));
    }
    return ids;
  }

  }  // namespace detail

  DTRAIN_DECL std::vector<PreferencePair> read_preference_pairs(const std::filesystem::path& file, std::int64_t block,
                                                                std::int64_t vocab) {
    std::ifstream in(file);
    if (!in)
      throw config_error("cannot read the preference pairs '" + file.string() + "'",
                         "pass a .jsonl file of {\"prompt_ids\", \"chosen_ids\", \"rejected_ids\"} objects");
    std::vector<PreferencePair> pairs;
    std::string text;
    for (std::int64_t line = 1; std::getline(in, text); ++line) {
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      const auto j = detail::parse_json<nlohmann::json>(text, [&](const std::string& problem) {
        return detail::pair_error(file, line, problem, "give one JSON object per line");
      });
      if (!j.is_object()) detail::bad_pair(file, line, "not a JSON object", "give one JSON object per line");
      PreferencePair p;
      p.prompt = detail::pair_ids(j, "prompt_ids", file, line, vocab);
      p.chosen = detail::pair_ids(j, "chosen_ids", file, line, vocab);
      p.rejected = detail::pair_ids(j, "rejected_ids", file, line, vocab);
      for (const auto* c : {&p.chosen, &p.rejected}) {
        const auto n = static_cast<std::int64_t>(p.prompt.size() + c->size());
        if (n > block + 1)
          detail::bad_pair(file, line,
                           "the prompt (" + std::to_string(p.prompt.size()) + " tokens) and its " +
                               (c == &p.chosen ? "chosen" : "rejected") + " completion (" + std::to_string(c->size()) +
                               ") are " + std::to_string(n) + " tokens, longer than the block (" +
                               std::to_string(block) + ") + 1",
                           "raise block_size to at least " + std::to_string(n - 1) +
                               ", or shorten the prompt or the completion when you make the file");
      }
      const bool rc = j.contains("ref_chosen_logps"), rr = j.contains("ref_rejected_logps");
      if (rc != rr)
        detail::bad_pair(file, line, std::string("has ") + (rc ? "ref_chosen_logps" : "ref_rejected_logps") + " alone",
                         "give both reference log-probabilities, or neither");
      if (rc) {
        if (!j["ref_chosen_logps"].is_number() || !j["ref_rejected_logps"].is_number())
          detail::bad_pair(file, line, "a reference log-probability is not a number",
                           "give ref_chosen_logps and ref_rejected_logps as numbers");
        p.ref_chosen = j["ref_chosen_logps"].get<double>();
        p.ref_rejected = j["ref_rejected_logps"].get<double>();
      }
      pairs.push_back(std::move(p));
    }
    if (pairs.empty())
      throw config_error("the preference pairs '" + file.string() + "' hold no pair",
                         "give one {\"prompt_ids\", \"chosen_ids\", \"rejected_ids\"} object per line");
    return pairs;
  }

  DTRAIN_DECL Batch preference_batch(std::span<const PreferencePair> pairs, std::int32_t pad_id) {
    const auto n = static_cast<std::int64_t>(pairs.size());
    if (n == 0) throw config_error("preference_batch: no pairs", "give at least one pair");
    std::int64_t time = 1;
    std::size_t refs = 0;
    for (const PreferencePair& p : pairs) {
      if (p.prompt.empty() || p.chosen.empty() || p.rejected.empty())
        throw config_error("preference_batch: a pair with an empty prompt or completion",
                           "drop the pair: a pair needs a prompt and two non-empty completions");
      time = std::max<std::int64_t>(
          time, static_cast<std::int64_t>(p.prompt.size() + std::max(p.chosen.size(), p.rejected.size())) - 1);
      refs += p.ref_chosen.has_value() && p.ref_rejected.has_value();
    }
    if (refs != 0 && refs != pairs.size())
      throw config_error("preference_batch: " + std::to_string(refs) + " of " + std::to_string(n) +
                             " pairs carry reference log-probabilities",
                         "precompute them for every pair, or for none (the reference model then computes them)");
    std::vector<std::int32_t> x(static_cast<std::size_t>(2 * n * time), pad_id), y(x.size(), -100);
    std::vector<double> ref;
    for (std::int64_t side = 0; side < 2; ++side)
      for (std::int64_t i = 0; i < n; ++i) {
        const PreferencePair& p = pairs[static_cast<std::size_t>(i)];
        const std::vector<std::int32_t>& completion = side == 0 ? p.chosen : p.rejected;
        std::vector<std::int32_t> ids(p.prompt);
        ids.insert(ids.end(), completion.begin(), completion.end());
        const std::int64_t row = (side * n + i) * time, prompt = static_cast<std::int64_t>(p.prompt.size());
        for (std::int64_t t = 0; t + 1 < static_cast<std::int64_t>(ids.size()); ++t) {
          x[static_cast<std::size_t>(row + t)] = ids[static_cast<std::size_t>(t)];
          if (t + 1 >= prompt) y[static_cast<std::size_t>(row + t)] = ids[static_cast<std::size_t>(t + 1)];
        }
        if (refs != 0) ref.push_back(side == 0 ? *p.ref_chosen : *p.ref_rejected);
      }
    Batch b;
    b.set("x", HostTensor::of(x, {2 * n, time}));
    b.set("y", HostTensor::of(y, {2 * n, time}));
    if (refs != 0) b.set("ref_logps", HostTensor::of(ref, {2 * n}));
    return b;
  }

}  // namespace dtrain

DTRAIN_IMPL_END
