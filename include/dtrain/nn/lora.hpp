#pragma once
// LoRA adapters (low-rank adaptation) on the projections of the nn units:
//
//   y = x W^T + b + scale * (x A^T) B^T      A [r, in], B [out, r]
//   scale = alpha / r  (rsLoRA: alpha / sqrt(r))
//
// With an adapter on, the projection's W and b are frozen (no gradient,
// master copy or optimizer state: they live in the frozen flat, in the
// compute dtype) and A and B are its trainable parameters, named
// "<projection>.lora_A" / ".lora_B" and tagged "lora". A starts as PEFT's
// Kaiming-uniform (a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))) and B as
// zeros, so training starts from the base model's outputs exactly.
//
// A projection whose output is several projections side by side (Llama's
// fused gate|up, which PEFT adapts as gate_proj and up_proj) has `segments`
// adapters: A is [segments r, in], B stays [out, r], and output block s (of
// out / segments columns) uses A's rows [s r, (s + 1) r).
//
// Forward keeps t = x A^T [rows, segments r] in the unit's saved view
// (saved_size grows by rows * segments * r); backward computes dB from it,
// then overwrites it with dt = scale * dy B and takes dA = dt^T x and
// dx += dt A from there. The adapter runs on the device's GEMM, so it is the
// same code on every device and dtype.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"

namespace dtrain::nn {

struct LoraOptions {
  std::int64_t r = 0;     // the rank; 0: no adapter
  float alpha = 8.f;      // PEFT's lora_alpha (its default 8)
  bool rslora = false;    // scale alpha / sqrt(r) (rank-stabilised LoRA) instead of alpha / r
  float dropout = 0.f;    // PEFT's lora_dropout: only 0 is supported yet (refused otherwise)

  bool on() const noexcept { return r > 0; }
  float scale() const { return rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r); }
};

namespace detail {

// One adapted projection [out, in] of a unit (or none: `on()` false).
class LoraSite {
 public:
  LoraSite() = default;
  LoraSite(const std::string& what, std::string name, const LoraOptions& o, std::int64_t in, std::int64_t out,
           std::int64_t segments = 1)
      : name_(std::move(name)), options_(o), in_(in), out_(out), segments_(segments) {
    const std::string where = what + (name_.empty() ? "" : " " + name_) + ": LoRA ";
    if (o.r < 0) throw config_error(where + "rank " + std::to_string(o.r) + " is negative", "give lora_r >= 1");
    if (!o.on()) return;
    if (segments < 1 || out % segments != 0)
      throw config_error(where + std::to_string(segments) + " segments do not divide " + std::to_string(out) +
                             " outputs",
                         "report this: the unit splits its projection wrongly");
    if (o.r > in || o.r > out / segments)
      throw config_error(where + "rank " + std::to_string(o.r) + " exceeds the layer's dimensions [" +
                             std::to_string(out / segments) + ", " + std::to_string(in) + "]",
                         "give lora_r <= " + std::to_string(std::min(in, out / segments)));
    if (!(o.alpha > 0.f) || !std::isfinite(o.alpha))
      throw config_error(where + "alpha " + std::to_string(o.alpha) + " must be positive and finite",
                         "give lora_alpha > 0 (PEFT's default is 8)");
    if (o.dropout != 0.f)
      throw config_error(where + "dropout " + std::to_string(o.dropout) + " is not supported yet",
                         "train with lora_dropout=0 (PEFT's default)");
  }

  bool on() const noexcept { return options_.on(); }
  std::int64_t rank() const noexcept { return options_.r; }
  std::int64_t segments() const noexcept { return segments_; }
  float scale() const { return options_.scale(); }
  // Columns of t = x A^T.
  std::int64_t width() const noexcept { return on() ? segments_ * options_.r : 0; }
  std::int64_t saved_size(std::int64_t rows) const noexcept { return rows * width(); }

  // {"<name>.lora_A", "<name>.lora_B"} ("lora_A", "lora_B" for an unnamed
  // projection), or none.
  std::vector<ParamSpec> params() const {
    if (!on()) return {};
    const std::string prefix = name_.empty() ? "" : name_ + ".";
    return {{prefix + "lora_A", {segments_ * options_.r, in_}, Init::fan_in_uniform(in_), true, {}, {"lora"}},
            {prefix + "lora_B", {out_, options_.r}, Init::zeros(), true, {}, {"lora"}}};
  }

  // out [rows, out] (contiguous) += scale * (x A^T) B^T, keeping t = x A^T.
  template <class Dev, class T>
  void forward(Dev& dev, const T* a, const T* b, MatView<const T> x, T* out, T* t) const {
    if (!on()) return;
    const std::int64_t n = x.rows, r = options_.r, w = width(), os = out_ / segments_;
    dev.gemm(false, true, n, w, in_, 1.f, x.data, in_, a, in_, 0.f, t, w);
    for (std::int64_t s = 0; s < segments_; ++s)
      dev.gemm(false, true, n, os, r, scale(), t + s * r, w, b + s * os * r, r, 1.f, out + s * os, out_);
  }

  // From d_out [rows, out] and forward's t: dB, dA (each skipped when
  // empty), and dx += the adapter's part of the input gradient (skipped when
  // dx is empty). Overwrites t.
  template <class Dev, class T>
  void backward(Dev& dev, const T* a, const T* b, MatView<T> da, MatView<T> db, MatView<const T> x, const T* d_out,
                T* t, MatView<T> dx) const {
    if (!on()) return;
    const std::int64_t n = x.rows, r = options_.r, w = width(), os = out_ / segments_;
    const float sc = scale();
    if (!db.empty())
      for (std::int64_t s = 0; s < segments_; ++s)
        dev.gemm(true, false, os, r, n, sc, d_out + s * os, out_, t + s * r, w, 0.f, db.data + s * os * r, r);
    for (std::int64_t s = 0; s < segments_; ++s)  // t becomes dt = scale * d_out B, segment by segment
      dev.gemm(false, false, n, r, os, sc, d_out + s * os, out_, b + s * os * r, r, 0.f, t + s * r, w);
    if (!da.empty()) dev.gemm(true, false, w, in_, n, 1.f, t, w, x.data, in_, 0.f, da.data, in_);
    if (!dx.empty()) dev.gemm(false, false, n, in_, w, 1.f, t, w, a, in_, 1.f, dx.data, in_);
  }

 private:
  std::string name_;
  LoraOptions options_{};
  std::int64_t in_ = 0, out_ = 0, segments_ = 1;
};

// The adapters of one unit, in the unit's order of projections. Their
// parameters follow the unit's own (A then B per adapted projection), and
// their t buffers follow the unit's own saved activations, in the same order.
class LoraSet {
 public:
  LoraSet() = default;
  LoraSet(std::size_t base_params, std::vector<LoraSite> sites) : base_(base_params), sites_(std::move(sites)) {}

  bool any() const noexcept {
    for (const auto& s : sites_)
      if (s.on()) return true;
    return false;
  }
  std::size_t param_count() const noexcept {
    std::size_t n = 0;
    for (const auto& s : sites_) n += s.on() ? 2 : 0;
    return n;
  }
  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    for (const auto& s : sites_)
      for (auto& p : s.params()) out.push_back(std::move(p));
    return out;
  }
  std::int64_t saved_size(std::int64_t rows) const noexcept {
    std::int64_t n = 0;
    for (const auto& s : sites_) n += s.saved_size(rows);
    return n;
  }
  bool on(std::size_t i) const { return sites_.at(i).on(); }

  // Site i's forward: out += its adapter's contribution; `saved` is where the
  // unit's t buffers start.
  template <class Dev, class T>
  void forward(Dev& dev, std::size_t i, UnitParams<const T> p, MatView<const T> x, T* out, T* saved) const {
    if (!sites_.at(i).on()) return;
    const std::size_t k = param_index(i);
    sites_[i].forward(dev, p[k].data, p[k + 1].data, x, out, saved + t_offset(i, x.rows));
  }

  template <class Dev, class T>
  void backward(Dev& dev, std::size_t i, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x,
                const T* d_out, T* saved, MatView<T> dx) const {
    if (!sites_.at(i).on()) return;
    const std::size_t k = param_index(i);
    sites_[i].backward(dev, p[k].data, p[k + 1].data, grad[k], grad[k + 1], x, d_out, saved + t_offset(i, x.rows),
                       dx);
  }

 private:
  std::size_t param_index(std::size_t i) const {
    std::size_t k = base_;
    for (std::size_t j = 0; j < i; ++j) k += sites_[j].on() ? 2 : 0;
    return k;
  }
  std::int64_t t_offset(std::size_t i, std::int64_t rows) const {
    std::int64_t o = 0;
    for (std::size_t j = 0; j < i; ++j) o += sites_[j].saved_size(rows);
    return o;
  }

  std::size_t base_ = 0;
  std::vector<LoraSite> sites_;
};

}  // namespace detail
}  // namespace dtrain::nn
