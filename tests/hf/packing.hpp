#pragma once
// Packed records (position_ids) against the same records one by one, on any
// device: shared by packing_test.cpp (the host) and hf_cuda_test.cu (a GPU).

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/trainer.hpp>

namespace dtrain::testing::packing {

using Json = nlohmann::ordered_json;

inline hf::LmConfig config_of(const std::string& type) {
  if (type == "gpt2")
    return hf::parse_config(Json{{"model_type", "gpt2"},
                                 {"vocab_size", 37},
                                 {"n_embd", 16},
                                 {"n_layer", 2},
                                 {"n_head", 4},
                                 {"n_positions", 16},
                                 {"layer_norm_epsilon", 1e-5},
                                 {"activation_function", "gelu_new"}},
                            "config.json");
  return hf::parse_config(Json{{"model_type", "llama"},
                               {"vocab_size", 37},
                               {"hidden_size", 16},
                               {"intermediate_size", 24},
                               {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},
                               {"num_key_value_heads", 2},
                               {"max_position_embeddings", 16},
                               {"rms_norm_eps", 1e-5},
                               {"hidden_act", "silu"},
                               {"tie_word_embeddings", false}},
                          "config.json");
}

struct Record {
  std::vector<std::int64_t> x, y;  // y: x's next ids, -100 where no loss (the prompt, the last token)
};

// Three records per rank of lengths 5, 3 and 6 (a packed block of 14), the
// first two tokens of each a prompt without loss.
inline std::vector<Record> records(int rank) {
  std::vector<Record> out;
  std::int64_t id = 3 + 11 * rank;
  for (const std::int64_t n : {5, 3, 6}) {
    Record r;
    for (std::int64_t t = 0; t < n; ++t) r.x.push_back((id += 7) % 37);
    for (std::int64_t t = 0; t < n; ++t)
      r.y.push_back(t < 2 || t + 1 == n ? -100 : r.x[static_cast<std::size_t>(t + 1)]);
    out.push_back(std::move(r));
  }
  return out;
}

inline Batch one(const Record& r) {
  Batch b;
  const auto n = static_cast<std::int64_t>(r.x.size());
  b.set("x", HostTensor::of(r.x, {1, n}));
  b.set("y", HostTensor::of(r.y, {1, n}));
  return b;
}

inline Batch packed(const std::vector<Record>& rs) {
  std::vector<std::int64_t> x, y, pos;
  for (const Record& r : rs) {
    x.insert(x.end(), r.x.begin(), r.x.end());
    y.insert(y.end(), r.y.begin(), r.y.end());
    for (std::size_t t = 0; t < r.x.size(); ++t) pos.push_back(static_cast<std::int64_t>(t));
  }
  const auto n = static_cast<std::int64_t>(x.size());
  Batch b;
  b.set("x", HostTensor::of(x, {1, n}));
  b.set("y", HostTensor::of(y, {1, n}));
  b.set("position_ids", HostTensor::of(pos, {1, n}));
  return b;
}

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> before, after;
};

// One SGD step (lr 1: the parameters move by the gradient) of the packed
// block, or of the records as three accumulated micro-batches.
template <class Dev, class Kind>
Result step(const std::string& type, int ranks, bool pack) {
  Result out;
  run_ranks(ranks, [&](World& w) {
    hf::CausalLm model(config_of(type));
    const auto rs = records(w.rank());
    auto run = [&](auto& trainer, const std::vector<Batch>& micro) {
      auto before = trainer.parameters();
      const StepStats st = trainer.step(micro);
      auto after = trainer.parameters();
      if (w.rank() == 0) out = {st.loss, std::move(before), std::move(after)};
    };
    if (pack) {
      Trainer<hf::CausalLm, Device<Dev>, Strategy<Kind>> trainer(w, model, SGD{.lr = 1.f}, {.seed = 4});
      run(trainer, {packed(rs)});
    } else {
      Trainer<hf::CausalLm, Device<Dev>, Strategy<Kind>, Accumulate<3>> trainer(w, model, SGD{.lr = 1.f}, {.seed = 4});
      run(trainer, {one(rs[0]), one(rs[1]), one(rs[2])});
    }
  });
  return out;
}

// The packed step against the records one by one on Dev, for Llama and
// GPT-2 at one rank (DDP) and two (FSDP): the loss to 1e-6, each
// gradient to 1e-6 of the largest.
template <class Dev>
void packed_records_train_as_the_records_one_by_one() {
  for (const std::string type : {"llama", "gpt2"})
    for (const int ranks : {1, 2}) {
      BOOST_TEST_CONTEXT(type << " at " << ranks << " rank(s)") {
        const Result p = ranks == 1 ? step<Dev, DDP>(type, 1, true) : step<Dev, FSDP<FullShard>>(type, 2, true);
        const Result s = ranks == 1 ? step<Dev, DDP>(type, 1, false) : step<Dev, FSDP<FullShard>>(type, 2, false);
        BOOST_TEST(p.loss == s.loss, boost::test_tools::tolerance(1e-6));
        BOOST_TEST((p.before == s.before), "both start from the same parameters");
        double worst = 0, scale = 0;
        for (const auto& [name, after] : p.after) {
          const auto& b = p.before.at(name);
          const auto& other = s.after.at(name);
          for (std::size_t i = 0; i < after.size(); ++i) {
            const double g1 = static_cast<double>(b[i]) - after[i], g2 = static_cast<double>(b[i]) - other[i];
            worst = std::max(worst, std::abs(g1 - g2));
            scale = std::max(scale, std::abs(g2));
          }
        }
        BOOST_TEST_MESSAGE(type << " at " << ranks << ": worst gradient difference " << worst << " (largest " << scale
                                << ")");
        BOOST_TEST(scale > 0.0);
        BOOST_TEST(worst <= 1e-6 * scale);
      }
    }
}

}  // namespace dtrain::testing::packing
