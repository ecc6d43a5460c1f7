#pragma once
// nn::ImagesPerRow<U>: runs an image unit U (one image per row: nn::Conv2d,
// the ResNet units) over rows that hold `k` images side by side, a sample's
// cameras: x [B, k * C * H * W] is the same memory as [B k, C * H * W], so
// the wrapper only changes the views it hands U (rows times k, width over
// k) and the sequence shape (batch times k). Parameters, saved view and
// names are U's.

#include <cstdint>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"

namespace dtrain::nn {

template <class U>
class ImagesPerRow {
 public:
  ImagesPerRow(U unit, std::int64_t k) : unit_(std::move(unit)), k_(k) {
    if (k < 1)
      throw config_error("nn::ImagesPerRow: " + std::to_string(k) + " images per row", "give at least one camera");
  }

  U& unit() { return unit_; }
  const U& unit() const { return unit_; }
  std::int64_t images() const { return k_; }

  std::vector<ParamSpec> params() const { return unit_.params(); }
  std::int64_t out_features(std::int64_t in) const {
    if (in % k_ != 0)
      throw config_error("nn::ImagesPerRow: rows of " + std::to_string(in) + " values do not hold " +
                             std::to_string(k_) + " images of one size",
                         "give every camera's image at the size the model was built for");
    return unit_.out_features(in / k_) * k_;
  }
  std::int64_t saved_size(SeqShape s, std::int64_t in) const { return saved_size_of(unit_, wide(s), in / k_); }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    UnitContext<T> c = ctx;
    c.shape = wide(ctx.shape);
    dtrain::detail::unit_forward<Dev, T>(unit_, dev, p, no_batch(), split(x), split(y), c);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    UnitContext<T> c = ctx;
    c.shape = wide(ctx.shape);
    dtrain::detail::unit_backward<Dev, T>(unit_, dev, p, grad, no_batch(), split(x), split(y), split(dy), split(dx), c);
  }

 private:
  static const DeviceBatch& no_batch() {
    static const DeviceBatch none{};
    return none;
  }
  SeqShape wide(SeqShape s) const { return {s.batch * k_, s.time}; }
  template <class T>
  MatView<T> split(MatView<T> v) const {
    if (v.data == nullptr) return v;
    return {v.data, v.rows * k_, v.cols / k_};
  }

  U unit_;
  std::int64_t k_;
};

}  // namespace dtrain::nn
