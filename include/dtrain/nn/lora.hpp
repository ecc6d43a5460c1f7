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
//
// In a cross-attention the k and v adapters read the memory (the text a
// diffusion model attends to), whose rows are not the queries': their sites
// are built `memory` and the calls name both row counts (LoraRows).
//
// lora_dropout p (PEFT's): in a training forward the adapter sees
// dropout(x), each element zeroed with probability p and the rest scaled by
// 1 / (1 - p), while the frozen projection sees x. The dropped input xd is
// kept beside t (rows * in more saved elements per adapter, as PyTorch keeps
// it for A's gradient): dA = dt^T xd, and dx gets the same mask applied to
// dt A. Each adapter (each segment of a fused projection, as PEFT's
// gate_proj and up_proj have a dropout each) draws its own mask from the
// unit's random stream (a pure function of the stream and the element, as
// nn::Dropout's), so a forward recomputed under activation checkpointing
// drops the same elements. Evaluation and predict() use x.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/dropout.hpp"

namespace dtrain::nn {

struct LoraOptions {
  std::int64_t r = 0;   // the rank; 0: no adapter
  float alpha = 8.f;    // PEFT's lora_alpha (its default 8)
  bool rslora = false;  // scale alpha / sqrt(r) (rank-stabilised LoRA) instead of alpha / r
  float dropout = 0.f;  // PEFT's lora_dropout: dropout on the adapter's input, in [0, 1)

  bool on() const noexcept { return r > 0; }
  float scale() const { return rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r); }
};

// Whether a unit's call trains (dropout on), the unit's random stream
// (what the adapters' dropout needs of the UnitContext), and whether the
// adapters take part at all (false: the base model's forward).
struct LoraDraw {
  bool training = false;
  std::uint64_t stream = 0;
  bool adapters = true;
};
template <class T>
LoraDraw lora_draw(const UnitContext<T>& ctx) noexcept {
  return {ctx.training, ctx.stream, ctx.adapters};
}

// The rows the sites of a unit see: the queries' (every site that reads the
// unit's input or its merged heads) and the memory's (the sites built
// `memory`, a cross-attention's k and v). -1: the call's input rows.
struct LoraRows {
  std::int64_t query = -1;
  std::int64_t memory = -1;
};

namespace detail {

// The key an adapter's dropout stream is derived with from its unit's
// stream: site i of a unit uses lora_stream_key + i.
inline constexpr std::uint64_t lora_stream_key = 0x4c6f5241'00000000ull;

// One adapted projection [out, in] of a unit (or none: `on()` false).
class LoraSite {
 public:
  LoraSite() = default;
  // Checks the options against the projection [out, in] and its segments;
  // `what` and `name` name the unit and projection in the errors.
  // `memory`: the site reads a cross-attention's memory (LoraRows::memory).
  DTRAIN_DECL LoraSite(const std::string& what, std::string name, const LoraOptions& o, std::int64_t in,
                       std::int64_t out, std::int64_t segments = 1, bool memory = false);

  bool on() const noexcept { return options_.on(); }
  bool memory() const noexcept { return memory_; }
  // The rows this site sees in a call over `rows`.
  std::int64_t rows_of(LoraRows rows) const noexcept { return memory_ ? rows.memory : rows.query; }
  std::int64_t rank() const noexcept { return options_.r; }
  std::int64_t segments() const noexcept { return segments_; }
  float scale() const { return options_.scale(); }
  // Columns of t = x A^T.
  std::int64_t width() const noexcept { return on() ? segments_ * options_.r : 0; }
  // t, then (with dropout) each segment's dropped input xd [rows, in].
  std::int64_t saved_size(std::int64_t rows) const noexcept {
    return rows * (width() + (on() && dropped() ? segments_ * in_ : 0));
  }

  // {"<name>.lora_A", "<name>.lora_B"} ("lora_A", "lora_B" for an unnamed
  // projection), or none.
  DTRAIN_DECL std::vector<ParamSpec> params() const;

  // out [rows, out] (contiguous) += scale * (x A^T) B^T, keeping t = x A^T
  // (x dropped in a training call with dropout, and kept after t); nothing
  // with the adapters off (draw.adapters false: a forward-only call).
  template <class Dev, class T>
  void forward(Dev& dev, const T* a, const T* b, MatView<const T> x, T* out, T* t, LoraDraw draw,
               std::uint64_t key) const {
    if (!on() || !draw.adapters) return;
    const std::int64_t n = x.rows, r = options_.r, w = width(), os = out_ / segments_;
    if (dropped() && draw.training) {
      const float p = options_.dropout;
      for (std::int64_t s = 0; s < segments_; ++s) {  // t's segment s = dropout_s(x) A_s^T
        T* xd = dropped_input(t, n, s);
        dev.for_each(static_cast<std::size_t>(n * in_),
                     nn::detail::DropoutApply<T>{x.data, xd, segment_stream(draw, key, s), p, 1.f / (1.f - p)});
        dev.gemm(false, true, n, r, in_, 1.f, xd, in_, a + s * r * in_, in_, 0.f, t + s * r, w);
      }
    } else {
      dev.gemm(false, true, n, w, in_, 1.f, x.data, in_, a, in_, 0.f, t, w);
    }
    for (std::int64_t s = 0; s < segments_; ++s)
      dev.gemm(false, true, n, os, r, scale(), t + s * r, w, b + s * os * r, r, 1.f, out + s * os, out_);
  }

  // From d_out [rows, out] and forward's t: dB, dA (each skipped when
  // empty), and dx += the adapter's part of the input gradient (skipped when
  // dx is empty). Overwrites t (and with dropout the xd after it).
  template <class Dev, class T>
  void backward(Dev& dev, const T* a, const T* b, MatView<T> da, MatView<T> db, MatView<const T> x, const T* d_out,
                T* t, MatView<T> dx, LoraDraw draw, std::uint64_t key) const {
    if (!on()) return;
    const std::int64_t n = x.rows, r = options_.r, w = width(), os = out_ / segments_;
    const float sc = scale();
    if (!db.empty())
      for (std::int64_t s = 0; s < segments_; ++s)
        dev.gemm(true, false, os, r, n, sc, d_out + s * os, out_, t + s * r, w, 0.f, db.data + s * os * r, r);
    for (std::int64_t s = 0; s < segments_; ++s)  // t becomes dt = scale * d_out B, segment by segment
      dev.gemm(false, false, n, r, os, sc, d_out + s * os, out_, b + s * os * r, r, 0.f, t + s * r, w);
    if (dropped() && draw.training) {  // segment s saw xd_s = dropout_s(x)
      const float p = options_.dropout;
      for (std::int64_t s = 0; s < segments_; ++s) {
        T* xd = dropped_input(t, n, s);
        if (!da.empty()) dev.gemm(true, false, r, in_, n, 1.f, t + s * r, w, xd, in_, 0.f, da.data + s * r * in_, in_);
        if (dx.empty()) continue;
        dev.gemm(false, false, n, in_, r, 1.f, t + s * r, w, a + s * r * in_, in_, 0.f, xd, in_);  // xd_s = dt_s A_s
        dev.for_each(static_cast<std::size_t>(n * in_),
                     nn::detail::DropoutApply<T, true>{xd, dx.data, segment_stream(draw, key, s), p, 1.f / (1.f - p)});
      }
      return;
    }
    if (!da.empty()) dev.gemm(true, false, w, in_, n, 1.f, t, w, x.data, in_, 0.f, da.data, in_);
    if (!dx.empty()) dev.gemm(false, false, n, in_, w, 1.f, t, w, a, in_, 1.f, dx.data, in_);
  }

 private:
  bool dropped() const noexcept { return options_.dropout > 0.f; }
  // Segment s's dropped input, after t in the saved view.
  template <class T>
  T* dropped_input(T* t, std::int64_t rows, std::int64_t s) const noexcept {
    return t + rows * width() + s * rows * in_;
  }
  static std::uint64_t segment_stream(LoraDraw draw, std::uint64_t key, std::int64_t s) noexcept {
    return dtrain::detail::derive_stream(draw.stream, key + (static_cast<std::uint64_t>(s) << 16));
  }

  std::string name_;
  LoraOptions options_{};
  std::int64_t in_ = 0, out_ = 0, segments_ = 1;
  bool memory_ = false;
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
  DTRAIN_DECL std::vector<ParamSpec> params() const;
  std::int64_t saved_size(std::int64_t rows) const noexcept { return saved_size(LoraRows{rows, rows}); }
  std::int64_t saved_size(LoraRows rows) const noexcept {
    std::int64_t n = 0;
    for (const auto& s : sites_) n += s.saved_size(s.rows_of(rows));
    return n;
  }
  bool on(std::size_t i) const { return sites_.at(i).on(); }

  // Site i's forward: out += its adapter's contribution; `saved` is where the
  // unit's t buffers start; `draw` the call's training flag and stream (its
  // dropout, if any); `rows` the call's rows where a site reads a memory.
  template <class Dev, class T>
  void forward(Dev& dev, std::size_t i, UnitParams<const T> p, MatView<const T> x, T* out, T* saved, LoraDraw draw,
               LoraRows rows = {}) const {
    if (!sites_.at(i).on()) return;
    const std::size_t k = param_index(i);
    sites_[i].forward(dev, p[k].data, p[k + 1].data, x, out, saved + t_offset(i, call_rows(rows, x.rows)), draw,
                      lora_stream_key + i);
  }

  template <class Dev, class T>
  void backward(Dev& dev, std::size_t i, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, const T* d_out,
                T* saved, MatView<T> dx, LoraDraw draw, LoraRows rows = {}) const {
    if (!sites_.at(i).on()) return;
    const std::size_t k = param_index(i);
    sites_[i].backward(dev, p[k].data, p[k + 1].data, grad[k], grad[k + 1], x, d_out,
                       saved + t_offset(i, call_rows(rows, x.rows)), dx, draw, lora_stream_key + i);
  }

 private:
  std::size_t param_index(std::size_t i) const {
    std::size_t k = base_;
    for (std::size_t j = 0; j < i; ++j) k += sites_[j].on() ? 2 : 0;
    return k;
  }
  static LoraRows call_rows(LoraRows rows, std::int64_t x_rows) noexcept {
    return rows.query < 0 ? LoraRows{x_rows, x_rows} : rows;
  }
  std::int64_t t_offset(std::size_t i, LoraRows rows) const {
    std::int64_t o = 0;
    for (std::size_t j = 0; j < i; ++j) o += sites_[j].saved_size(sites_[j].rows_of(rows));
    return o;
  }

  std::size_t base_ = 0;
  std::vector<LoraSite> sites_;
};

}  // namespace detail
}  // namespace dtrain::nn

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/lora.ipp"
#endif
