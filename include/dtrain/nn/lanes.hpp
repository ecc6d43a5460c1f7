#pragma once
// Units that move activations along lanes (model/unit.hpp): a UNet's skip
// connections, which the down path writes and the up path reads, and any
// activation a later unit needs besides its input.
//
//  - nn::WriteLane(id): passes its input through (y = x) and keeps it as lane
//    `id`; backward adds the gradient the readers summed for the lane to dy.
//  - nn::ConcatLane(id, width): y = [x | lane] per row (for images, one per
//    row in NCHW, that is the channel concatenation of a UNet's up path:
//    torch.cat([x, skip], dim=1)); `width` is the lane's, so that the output
//    width follows from the input's.
//  - nn::AddLane(id): y = x + lane (a long residual).
//
// A reader's lane has as many rows as its input. None has parameters or
// keeps anything from forward.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"

namespace dtrain::nn {

namespace detail {

// One row per index: out[r] = [a[r] | b[r]].
template <class T>
struct ConcatRows {
  const T* a;
  const T* b;
  T* out;
  std::int64_t width_a, width_b;
  std::size_t work_per_index() const { return static_cast<std::size_t>(width_a + width_b); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    T* o = out + r * (width_a + width_b);
    for (std::int64_t c = 0; c < width_a; ++c) o[c] = a[r * width_a + c];
    for (std::int64_t c = 0; c < width_b; ++c) o[width_a + c] = b[r * width_b + c];
  }
};

// One row per index: the concatenation's gradient split back, the first
// part into da (overwritten, unless null), the second added into db.
template <class T>
struct SplitRowsGrad {
  const T* dout;
  T* da;
  T* db;
  std::int64_t width_a, width_b;
  std::size_t work_per_index() const { return static_cast<std::size_t>(width_a + width_b); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    const T* d = dout + r * (width_a + width_b);
    if (da != nullptr)
      for (std::int64_t c = 0; c < width_a; ++c) da[r * width_a + c] = d[c];
    for (std::int64_t c = 0; c < width_b; ++c)
      db[r * width_b + c] = dtype_cast<T>(static_cast<float>(db[r * width_b + c]) + static_cast<float>(d[width_a + c]));
  }
};

inline void check_lane_rows(const char* unit, int id, std::int64_t lane_rows, std::int64_t lane_width,
                            std::int64_t rows, std::int64_t width) {
  if (lane_rows != rows || (width >= 0 && lane_width != width))
    throw config_error(std::string(unit) + ": lane " + std::to_string(id) + " holds " + std::to_string(lane_rows) +
                           " x " + std::to_string(lane_width) + " values, the unit's input " + std::to_string(rows) +
                           " rows" + (width >= 0 ? " x " + std::to_string(width) : std::string{}),
                       "read a lane written at the resolution and width of this point of the model");
}

}  // namespace detail

class WriteLane {
 public:
  explicit WriteLane(int id) : id_(id) {}
  int id() const { return id_; }

  std::vector<ParamSpec> params() const { return {}; }
  std::int64_t out_features(std::int64_t in) const { return in; }
  std::vector<LaneSpec> lanes_written(SeqShape in, std::int64_t width) const { return {{id_, in.rows(), width}}; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T>, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const MatView<T> lane = ctx.lane(id_);
    detail::check_lane_rows("nn::WriteLane", id_, lane.rows, lane.cols, x.rows, x.cols);
    dev.copy(y.data, x.data, static_cast<std::size_t>(x.size()));
    dev.copy(lane.data, x.data, static_cast<std::size_t>(x.size()));
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T>, MatView<const T>, MatView<const T>, MatView<const T> dy,
                MatView<T> dx, const UnitContext<T>& ctx) {
    if (dx.data == nullptr) return;
    const MatView<T> dlane = ctx.lane_grad(id_);
    dev.for_each(static_cast<std::size_t>(dy.size()), dtrain::AddElements<T>{dy.data, dlane.data, dx.data});
  }

 private:
  int id_;
};

class ConcatLane {
 public:
  ConcatLane(int id, std::int64_t lane_width) : id_(id), lane_width_(lane_width) {
    if (lane_width < 1)
      throw config_error("nn::ConcatLane: a lane width of " + std::to_string(lane_width),
                         "give the width of the rows the lane's writer keeps");
  }
  int id() const { return id_; }

  std::vector<ParamSpec> params() const { return {}; }
  std::int64_t out_features(std::int64_t in) const { return in + lane_width_; }
  std::vector<int> lanes_read() const { return {id_}; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T>, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const MatView<T> lane = ctx.lane(id_);
    detail::check_lane_rows("nn::ConcatLane", id_, lane.rows, lane.cols, x.rows, lane_width_);
    dev.for_each(static_cast<std::size_t>(x.rows), detail::ConcatRows<T>{x.data, lane.data, y.data, x.cols, lane.cols});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T>, MatView<const T> x, MatView<const T>, MatView<const T> dy,
                MatView<T> dx, const UnitContext<T>& ctx) {
    const MatView<T> dlane = ctx.lane_grad(id_);
    dev.for_each(static_cast<std::size_t>(x.rows),
                 detail::SplitRowsGrad<T>{dy.data, dx.data, dlane.data, x.cols, lane_width_});
  }

 private:
  int id_;
  std::int64_t lane_width_;
};

class AddLane {
 public:
  explicit AddLane(int id) : id_(id) {}
  int id() const { return id_; }

  std::vector<ParamSpec> params() const { return {}; }
  std::int64_t out_features(std::int64_t in) const { return in; }
  std::vector<int> lanes_read() const { return {id_}; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T>, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const MatView<T> lane = ctx.lane(id_);
    detail::check_lane_rows("nn::AddLane", id_, lane.rows, lane.cols, x.rows, x.cols);
    dev.for_each(static_cast<std::size_t>(x.size()), dtrain::AddElements<T>{x.data, lane.data, y.data});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T>, MatView<const T>, MatView<const T>, MatView<const T> dy,
                MatView<T> dx, const UnitContext<T>& ctx) {
    const MatView<T> dlane = ctx.lane_grad(id_);
    dev.for_each(static_cast<std::size_t>(dy.size()), dtrain::AddElements<T>{dy.data, dlane.data, dlane.data});
    if (dx.data != nullptr) dev.copy(dx.data, dy.data, static_cast<std::size_t>(dy.size()));
  }

 private:
  int id_;
};

}  // namespace dtrain::nn
