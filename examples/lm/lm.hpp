#pragma once
// The train_lm example: a GPT-2 or Llama-family causal language model (hf::CausalLm)
// fine-tuned from a transformers checkpoint (model=DIR) or trained from a
// config (config=FILE), on a pre-tokenized stream of ids cut into blocks;
// optionally written back as a transformers directory (save_hf=DIR).
//
//   units: as hf::CausalLm (embeddings, blocks, final norm, lm_head)
//   batch: x int32 [B, block_size] ids, y int32 [B, block_size] the next ones
//   data:  a token file: .npy (1-D int32/int64) or .bin (dtrain token stream:
//          the 8 bytes "DTRNTOK1", a little-endian uint32 id width 2 or 4, a
//          uint32 0, then the ids little-endian), cut into windows; or
//          instruction records (.jsonl), one sequence each, the loss over
//          their completion tokens only; or (objective=dpo) preference
//          pairs (.jsonl of prompt_ids, chosen_ids, rejected_ids), each
//          micro-batch P pairs as 2P sequences (data/preference.hpp)

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/dispatch.hpp"
#include "common/windows.hpp"
#include <nlohmann/json.hpp>

#include <dtrain/data/dataset.hpp>
#include <dtrain/data/preference.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/hf/config.hpp>
#include <dtrain/hf/lora.hpp>
#include <dtrain/hf/model.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/models/causal_lm.hpp>

namespace lm {

// The model's keys (dtrain/models/causal_lm.hpp, which dtrain-estimate reads
// too) and the run's own.
struct Config : dtrain::models::CausalLmConfig {
  std::string data;                             // the token file (.npy or .bin)
  std::string save_hf;                          // write the trained model here as a transformers directory
  std::int64_t eval_batches = 8;                // held-out batches per rank evaluated at the end
  std::int64_t generate = 0;                    // at the end, continue the prompt by this many tokens
  std::vector<std::int64_t> prompt;             // its ids (default: the first 8 held-out tokens)
  std::int64_t top_k = 0;                       // > 0: sample among the k likeliest (seeded by seed)
  float top_p = 1.f;                            // < 1: sample among the fewest likeliest reaching top_p
  float temperature = 0.f;                      // 0: greedy, unless top_k or top_p samples (then 1)
  std::vector<std::int64_t> stop;               // generation ends after one of these ids
  std::int64_t generate_batch = 1;              // generate: continue this many copies of the prompt at once
  std::string save_adapter;                     // write the adapters here in PEFT's format
  std::vector<std::string> checkpoint_modules;  // recompute the units of these modules (hf::units_named)
  // objective=dpo: preference tuning (nn::PreferenceLoss) on pairs
  std::string objective = "lm";       // lm (next-token cross-entropy) | dpo | grpo
  float beta = -1.f;                  // DPO's or GRPO's beta; < 0: TRL's default (DPO 0.1, GRPO 0)
  std::string loss_type = "sigmoid";  // sigmoid | hinge | ipo | robust (TRL's names)
  float label_smoothing = 0.f;        // loss_type=robust: the probability a label is flipped
  std::string reference = "auto";     // base | copy | data | auto (see train_lm --help)
  std::string ref_model;              // reference=copy: the reference's model directory (default: model=)
  // objective=grpo: online RL on prompts (nn::GrpoLoss, train/grpo.hpp)
  std::string reward;                // token:ID | regex:PATTERN
  std::string vocab_file;            // regex rewards: the vocabulary that decodes completions
  std::int64_t num_generations = 8;  // completions per prompt (TRL's default)
  std::int64_t max_new_tokens = 16;  // per completion
  float epsilon = 0.2f;              // the ratio's clip, TRL's default
  float epsilon_high = 0.f;          // its upper clip; 0: epsilon
  bool dpo() const { return objective == "dpo"; }
  bool grpo() const { return objective == "grpo"; }
  float beta_or_default() const { return beta >= 0.f ? beta : dpo() ? 0.1f : 0.f; }
};

// This process's peak resident set so far (Linux reports ru_maxrss in KiB).
inline double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// The size of a model directory's safetensors files.
inline double checkpoint_mib(const std::string& dir) {
  double bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") bytes += static_cast<double>(e.file_size());
  return bytes / (1024.0 * 1024.0);
}

// One sequence for supervised fine-tuning: x its ids but the last, y the
// next ids with -100 where no loss is wanted (the prompt, the padding);
// both block_size long.
struct Record {
  std::vector<std::int32_t> x, y;
  std::int64_t length = 0;  // the record's own tokens in x (the rest is padding)
};

struct Tokens {
  std::vector<std::int32_t> ids;                   // a token stream, cut into windows
  std::vector<Record> records;                     // or instruction records
  std::vector<dtrain::PreferencePair> pairs;       // or preference pairs (objective=dpo)
  std::vector<std::vector<std::int64_t>> prompts;  // or prompts (objective=grpo)
  std::int64_t split = 0;                          // ids (records) before it train, after it evaluate: the last tenth
  // packing=true: the training records packed into blocks, each a list of
  // record indices (pack_records)
  std::vector<std::vector<std::int64_t>> packs;
  bool sft() const { return !records.empty(); }
  bool dpo() const { return !pairs.empty(); }
  bool grpo() const { return !prompts.empty(); }
};

// The preference pairs of `file` (objective=dpo), the last tenth held out.
inline Tokens read_pairs(const std::string& file, std::int64_t block_size, std::int64_t vocab) {
  Tokens t;
  t.pairs = dtrain::read_preference_pairs(file, block_size, vocab);
  const auto n = static_cast<std::int64_t>(t.pairs.size());
  if (n < 2)
    throw dtrain::config_error(
        "'" + file + "' has " + std::to_string(n) + " pair(s): too few for training pairs and a held-out tenth",
        "give at least 2 pairs");
  t.split = n - std::max<std::int64_t>(1, n / 10);
  return t;
}

// Packs the training records (those before the split) into blocks of
// `block` tokens, best fit by decreasing length (as TRL's padding-free
// packing): each record goes to the fullest block it still fits in.
inline std::vector<std::vector<std::int64_t>> pack_records(const Tokens& t, std::int64_t block) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(t.split));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return t.records[static_cast<std::size_t>(a)].length > t.records[static_cast<std::size_t>(b)].length;
  });
  std::vector<std::vector<std::int64_t>> packs;
  std::multimap<std::int64_t, std::size_t> room;  // space left -> pack
  for (const std::int64_t i : order) {
    const std::int64_t n = t.records[static_cast<std::size_t>(i)].length;
    auto it = room.lower_bound(n);
    std::size_t p = packs.size();
    std::int64_t left = block;
    if (it != room.end()) {
      p = it->second;
      left = it->first;
      room.erase(it);
    } else {
      packs.emplace_back();
    }
    packs[p].push_back(i);
    if (left - n > 0) room.emplace(left - n, p);
  }
  return packs;
}

// The samples of one side of the split: windows of the stream, records or
// preference pairs.
// With packed records (Tokens::packs) the training samples are the packed
// blocks, with "position_ids" restarting at each record; the held-out side
// stays one record per sample.
class Samples {
 public:
  Samples(const Tokens& t, std::int64_t block, bool train)
      : t_(t),
        windows_(t.ids, block, train ? 0 : t.split, train ? t.split : static_cast<std::int64_t>(t.ids.size())),
        block_(block),
        first_(train ? 0 : t.split),
        packed_(train && !t.packs.empty()),
        count_(packed_    ? static_cast<std::int64_t>(t.packs.size())
               : t.sft()  ? (train ? t.split : static_cast<std::int64_t>(t.records.size()) - t.split)
               : t.dpo()  ? (train ? t.split : static_cast<std::int64_t>(t.pairs.size()) - t.split)
               : t.grpo() ? (train ? t.split : static_cast<std::int64_t>(t.prompts.size()) - t.split)
                          : windows_.size()) {}

  std::int64_t size() const { return count_; }

  dtrain::Batch gather(std::span<const std::int64_t> indices) const {
    if (t_.grpo()) {  // the prompts' indices: their completions are sampled before the step (train/grpo.hpp)
      std::vector<std::int64_t> at;
      for (const auto i : indices) at.push_back(first_ + i);
      dtrain::Batch b;
      b.set("prompt_index", dtrain::HostTensor::of(at, {static_cast<std::int64_t>(at.size())}));
      return b;
    }
    if (t_.dpo()) {  // P pairs as 2P sequences: the chosen rows, then the rejected
      std::vector<dtrain::PreferencePair> pairs;
      pairs.reserve(indices.size());
      for (const auto i : indices) pairs.push_back(t_.pairs[static_cast<std::size_t>(first_ + i)]);
      return dtrain::preference_batch(pairs);
    }
    if (!t_.sft()) return windows_.gather(indices);
    if (packed_) return gather_packed(indices);
    const auto n = static_cast<std::int64_t>(indices.size());
    std::vector<std::int32_t> x, y;
    for (const auto i : indices) {
      const Record& r = t_.records[static_cast<std::size_t>(first_ + i)];
      x.insert(x.end(), r.x.begin(), r.x.end());
      y.insert(y.end(), r.y.begin(), r.y.end());
    }
    dtrain::Batch b;
    b.set("x", dtrain::HostTensor::of(x, {n, block_}));
    b.set("y", dtrain::HostTensor::of(y, {n, block_}));
    return b;
  }

 private:
  // Each pack's records end to end, then padding (no loss) to the block.
  dtrain::Batch gather_packed(std::span<const std::int64_t> indices) const {
    const auto n = static_cast<std::int64_t>(indices.size());
    std::vector<std::int32_t> x, y;
    std::vector<std::int64_t> pos;
    for (const auto i : indices) {
      std::int64_t used = 0;
      for (const std::int64_t k : t_.packs[static_cast<std::size_t>(i)]) {
        const Record& r = t_.records[static_cast<std::size_t>(k)];
        x.insert(x.end(), r.x.begin(), r.x.begin() + r.length);
        y.insert(y.end(), r.y.begin(), r.y.begin() + r.length);
        for (std::int64_t p = 0; p < r.length; ++p) pos.push_back(p);
        used += r.length;
      }
      for (std::int64_t p = 0; used < block_; ++used, ++p) {  // the padding: a record of its own, no loss
        x.push_back(0);
        y.push_back(-100);
        pos.push_back(p);
      }
    }
    dtrain::Batch b;
    b.set("x", dtrain::HostTensor::of(x, {n, block_}));
    b.set("y", dtrain::HostTensor::of(y, {n, block_}));
    b.set("position_ids", dtrain::HostTensor::of(pos, {n, block_}));
    return b;
  }

  const Tokens& t_;
  examples::Windows windows_;
  std::int64_t block_, first_;
  bool packed_;
  std::int64_t count_;
};

namespace detail {

inline dtrain::config_error record_error(const std::string& file, std::size_t line, const std::string& what) {
  return dtrain::config_error("'" + file + "' line " + std::to_string(line) + ": " + what,
                              "give one JSON object per line: {\"input_ids\": [...], \"labels\": [...]} (-100: no "
                              "loss) or {\"input_ids\": [...], \"prompt_length\": N}");
}

[[noreturn]] inline void bad_record(const std::string& file, std::size_t line, const std::string& what) {
  throw record_error(file, line, what);
}

// Instruction records, one JSON object per line: input_ids with either
// labels (transformers' convention: aligned with input_ids, -100 where no
// loss is wanted) or prompt_length (the loss over the tokens after it).
// Cut to block_size + 1 tokens, padded after the end (causal attention
// never lets a real token see the padding; the padding carries no loss).
inline std::vector<Record> read_records(const std::string& file, std::int64_t block, std::int64_t vocab) {
  std::ifstream in(file);
  if (!in) throw dtrain::config_error("cannot read the records file '" + file + "'", "pass data=FILE.jsonl");
  std::vector<Record> out;
  std::string text;
  for (std::size_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = dtrain::detail::parse_json<nlohmann::json>(
        text, [&](const std::string& problem) { return record_error(file, line, problem); });
    if (!j.is_object() || !j.contains("input_ids") || !j["input_ids"].is_array())
      bad_record(file, line, "no input_ids list");
    std::vector<std::int64_t> ids, labels;
    for (const auto& v : j["input_ids"]) {
      if (!v.is_number_integer()) bad_record(file, line, "input_ids holds " + v.dump() + ", not an integer id");
      ids.push_back(v.get<std::int64_t>());
    }
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab)
        bad_record(file, line,
                   "token " + std::to_string(i) + " is id " + std::to_string(ids[i]) +
                       ", outside the model's vocabulary of " + std::to_string(vocab));
    if (j.contains("labels")) {
      if (!j["labels"].is_array() || j["labels"].size() != ids.size())
        bad_record(file, line, "labels is not a list as long as input_ids");
      for (const auto& v : j["labels"]) {
        const std::int64_t l = v.is_number_integer() ? v.get<std::int64_t>() : -2;
        if (l != -100 && (l < 0 || l >= vocab)) bad_record(file, line, "labels holds " + v.dump());
        labels.push_back(l);
      }
    } else if (j.contains("prompt_length") && j["prompt_length"].is_number_integer()) {
      const std::int64_t k = j["prompt_length"].get<std::int64_t>();
      if (k < 0 || k > static_cast<std::int64_t>(ids.size()))
        bad_record(file, line, "prompt_length " + std::to_string(k) + " is outside 0.." + std::to_string(ids.size()));
      labels = ids;
      std::fill(labels.begin(), labels.begin() + k, -100);
    } else {
      bad_record(file, line, "neither labels nor an integer prompt_length");
    }
    const std::size_t n = std::min(ids.size(), static_cast<std::size_t>(block + 1));
    if (n < 2) bad_record(file, line, "fewer than 2 tokens");
    Record r{std::vector<std::int32_t>(static_cast<std::size_t>(block), 0),
             std::vector<std::int32_t>(static_cast<std::size_t>(block), -100), static_cast<std::int64_t>(n) - 1};
    bool any = false;
    for (std::size_t t = 0; t + 1 < n; ++t) {
      r.x[t] = static_cast<std::int32_t>(ids[t]);
      r.y[t] = static_cast<std::int32_t>(labels[t + 1]);
      any = any || labels[t + 1] != -100;
    }
    if (!any)
      bad_record(file, line, "no token to learn within block_size + 1 = " + std::to_string(block + 1) + " tokens");
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace detail

// Every id of `file`, checked against the vocabulary.
inline Tokens read_tokens(const std::string& file, std::int64_t block_size, std::int64_t vocab) {
  Tokens t;
  if (file.ends_with(".jsonl")) {
    t.records = detail::read_records(file, block_size, vocab);
    const auto n = static_cast<std::int64_t>(t.records.size());
    t.split = n - std::max<std::int64_t>(1, n / 10);
    if (n < 2)
      throw dtrain::config_error(
          "'" + file + "' has " + std::to_string(n) + " record(s): too few for training records and a held-out tenth",
          "give at least 2 records");
    return t;
  }
  if (file.ends_with(".npy")) {
    const auto a = dtrain::detail::read_npy(file);
    if (a.shape.size() != 1)
      throw dtrain::config_error("'" + file + "' holds an array of " + std::to_string(a.shape.size()) +
                                     " dimensions, not a 1-D stream of token ids",
                                 "save the ids as one 1-D int32 or int64 array");
    t.ids = dtrain::detail::npy_labels(a, "'" + file + "'");
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw dtrain::config_error("cannot read the token file '" + file + "'", "pass data=FILE.npy or FILE.bin");
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::uint32_t width = 0, zero = 1;
    if (bytes.size() < 16 || std::memcmp(bytes.data(), "DTRNTOK1", 8) != 0 ||
        (std::memcpy(&width, bytes.data() + 8, 4), std::memcpy(&zero, bytes.data() + 12, 4), zero != 0) ||
        (width != 2 && width != 4) || (bytes.size() - 16) % width != 0)
      throw dtrain::config_error("'" + file + "' is not a dtrain token file (header DTRNTOK1, id width 2 or 4)",
                                 "give a 1-D int32/int64 .npy of ids, or a stream with that header");
    const std::size_t n = (bytes.size() - 16) / width;
    t.ids.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t v = 0;
      std::memcpy(&v, bytes.data() + 16 + i * width, width);  // little-endian host (checked by the data layer)
      t.ids[i] = static_cast<std::int32_t>(v);
    }
  }
  for (std::size_t i = 0; i < t.ids.size(); ++i)
    if (t.ids[i] < 0 || t.ids[i] >= vocab)
      throw dtrain::config_error("'" + file + "': token " + std::to_string(i) + " is id " + std::to_string(t.ids[i]) +
                                     ", outside the model's vocabulary of " + std::to_string(vocab),
                                 "tokenize with the model's own tokenizer");
  t.split = static_cast<std::int64_t>(t.ids.size()) * 9 / 10;
  if (t.split <= block_size || static_cast<std::int64_t>(t.ids.size()) - t.split <= block_size)
    throw dtrain::config_error("'" + file + "' has " + std::to_string(t.ids.size()) +
                                   " tokens: too few for blocks of block_size " + std::to_string(block_size) +
                                   " in both the training nine tenths and the held-out tenth",
                               "use more data or a smaller block_size");
  return t;
}

// The prompts of `file` (objective=grpo): one {"prompt_ids": [...]} per
// line (other keys, a pairs file's completions, are left alone), each with
// room for max_new_tokens in block_size + 1 positions; the last tenth held out.
inline Tokens read_prompts(const std::string& file, std::int64_t block_size, std::int64_t vocab,
                           std::int64_t max_new_tokens) {
  std::ifstream in(file);
  if (!in) throw dtrain::config_error("cannot read the prompts '" + file + "'", "pass data=PROMPTS.jsonl");
  Tokens t;
  std::string text;
  for (std::size_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto bad = [&](const std::string& what, const std::string& fix) {
      throw dtrain::config_error("'" + file + "' line " + std::to_string(line) + ": " + what, fix);
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      bad("not JSON", "give one {\"prompt_ids\": [...]} object per line");
    }
    if (!j.is_object() || !j.contains("prompt_ids") || !j["prompt_ids"].is_array() || j["prompt_ids"].empty())
      bad("no non-empty prompt_ids list", "give one {\"prompt_ids\": [...]} object per line");
    std::vector<std::int64_t> ids;
    for (const auto& v : j["prompt_ids"]) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= vocab)
        bad("prompt_ids holds " + v.dump() + ", not a token id in [0, " + std::to_string(vocab) + ")",
            "tokenize with the model's tokenizer");
      ids.push_back(v.get<std::int64_t>());
    }
    if (static_cast<std::int64_t>(ids.size()) + max_new_tokens > block_size + 1)
      bad("a prompt of " + std::to_string(ids.size()) + " tokens and max_new_tokens " + std::to_string(max_new_tokens) +
              " are longer than the block (" + std::to_string(block_size) + ") + 1",
          "raise block_size to " + std::to_string(static_cast<std::int64_t>(ids.size()) + max_new_tokens - 1) +
              ", or shorten the prompt or max_new_tokens");
    t.prompts.push_back(std::move(ids));
  }
  const auto n = static_cast<std::int64_t>(t.prompts.size());
  if (n < 2)
    throw dtrain::config_error(
        "'" + file + "' has " + std::to_string(n) + " prompt(s): too few for training prompts and a held-out tenth",
        "give at least 2 prompts");
  t.split = n - std::max<std::int64_t>(1, n / 10);
  return t;
}

int train_host(const Config&, dtrain::World&, const dtrain::hf::LmConfig&, const Tokens&);
int train_cuda(const Config&, dtrain::World&, const dtrain::hf::LmConfig&, const Tokens&);

}  // namespace lm
