#pragma once
// Parameter declarations. A unit says what parameters it has; the library
// allocates, initialises, shards and updates them.

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace dtrain {

enum class init_kind { zeros, ones, constant, uniform, normal, given };

struct Init {
  init_kind kind = init_kind::zeros;
  float a = 0.f;  // constant value / uniform low / normal mean
  float b = 0.f;  // uniform high / normal stddev
  // given: the values themselves (a model that brings its own weights, such
  // as a LibTorch module: dtrain/torch/), numel of them, equal on every rank.
  std::shared_ptr<const std::vector<float>> values{};
  std::uint64_t values_hash = 0;  // of the values' bits, for the model's signature

  static Init zeros() { return {init_kind::zeros, 0.f, 0.f}; }
  static Init given(std::vector<float> v) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the values' bits
    for (const float x : v) {
      h = (h ^ std::bit_cast<std::uint32_t>(x)) * 0x100000001b3ull;
    }
    return {init_kind::given, 0.f, 0.f, std::make_shared<const std::vector<float>>(std::move(v)), h};
  }
  static Init ones() { return {init_kind::ones, 0.f, 0.f}; }
  static Init constant(float v) { return {init_kind::constant, v, 0.f}; }
  static Init uniform(float lo, float hi) { return {init_kind::uniform, lo, hi}; }
  static Init normal(float mean, float stddev) { return {init_kind::normal, mean, stddev}; }
  // PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  static Init fan_in_uniform(std::int64_t fan_in) {
    const float bound = 1.f / std::sqrt(static_cast<float>(fan_in));
    return uniform(-bound, bound);
  }
};

struct ParamSpec {
  std::string name;                 // unique within its unit, e.g. "weight"
  std::vector<std::int64_t> shape;  // e.g. {out, in}
  Init init{};
  bool trainable = true;
  // Tied weights: the layout name ("<unit>.<param>") of a parameter of this
  // or an earlier unit that this one IS (GPT-2's output head is its token
  // embedding). A tied parameter has no storage, initialisation or
  // optimizer state of its own; its shape must equal the owner's, and it is
  // trainable when the owner is. See ModelLayout::ties().
  std::string tied_to{};
  // What kind of parameter this is, for parameter groups to select by
  // ("tag:bias"): dtrain's units tag biases "bias", normalisation gains and
  // shifts "norm" and embedding tables "embedding".
  std::vector<std::string> tags{};

  std::int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>{});
  }
};

}  // namespace dtrain
