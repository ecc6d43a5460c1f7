#pragma once
// Shared by the strategy tests: a model with uneven shapes (15x7, 16x15
// frozen, 17x16, 5x17), deterministic batches, and comparisons.

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <support/ranks.hpp>
#include <support/rel_diff.hpp>

#include <dtrain/trainer.hpp>

namespace dtrain::testing {

inline constexpr std::int64_t features = 7;
inline constexpr std::int64_t classes = 5;

// Uneven shapes that no world size of 2, 3 or 4 divides, a LayerNorm, a
// frozen layer in the middle and parameter-free units between them.
struct UnevenNet {
  nn::Linear l1{features, 15};
  nn::LayerNorm ln{15};
  nn::GELU act;
  nn::Linear frozen{15, 16, {.bias = true, .trainable = false}};
  nn::ReLU relu;
  nn::Linear l2{16, 17};
  nn::GELU act2;
  nn::Linear head{17, classes};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, ln, act, frozen, relu, l2, act2, head); }
};

// Rows [first, first + rows) of a deterministic global batch for `step`:
// random non-zero x and random labels.
inline Batch rows_of(int step, std::int64_t first, std::int64_t rows) {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (std::int64_t r = first; r < first + rows; ++r) {
    for (double v : random_values(features, static_cast<std::uint64_t>(step * 100003 + r)))
      x.push_back(static_cast<float>(v));
    y.push_back(static_cast<std::int32_t>((step * 31 + r * 7) % classes));
  }
  return Batch::table(x, y, rows, features);
}

// Micro-batches of `sizes` rows for rank `rank` at `step`: uneven sizes, the
// rank's rows following each other in the global batch.
inline std::vector<Batch> micro_batches(int step, int rank, const std::vector<std::int64_t>& sizes) {
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  std::vector<Batch> out;
  std::int64_t first = rank * total;
  for (auto s : sizes) {
    out.push_back(rows_of(step, first, s));
    first += s;
  }
  return out;
}

// A dataset for UnevenNet: `rows` rows of random non-zero features (row r
// seeded with r + seed), labels r mod classes.
inline Dataset random_dataset(std::int64_t rows, std::uint64_t seed) {
  Dataset d;
  d.rows = rows;
  d.features = features;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (double v : random_values(features, static_cast<std::uint64_t>(r) + seed)) d.x.push_back(static_cast<float>(v));
    d.y.push_back(static_cast<std::int32_t>(r % classes));
  }
  return d;
}

// The largest difference ranks (threads) report, and where.
struct Worst {
  std::mutex mu;
  double diff = 0;
  std::string where;
  void update(double d, const std::string& w) {
    std::lock_guard lock(mu);
    if (d > diff || std::isnan(d)) diff = std::isnan(d) ? INFINITY : d, where = w;
  }
};

}  // namespace dtrain::testing
