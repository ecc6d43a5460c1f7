#pragma once
// Non-owning views the library hands to units. They never own or allocate;
// the data may live on the host or on a CUDA device (the Device policy knows).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "dtrain/core/macros.hpp"

namespace dtrain {

// A row-major matrix view: rows x cols, contiguous. Activations are
// [samples, features]; a parameter of any rank is viewed as [shape[0], rest].
template <class T>
struct MatView {
  T* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;

  DTRAIN_HOST_DEVICE std::int64_t size() const { return rows * cols; }
  DTRAIN_HOST_DEVICE bool empty() const { return data == nullptr || size() == 0; }
  DTRAIN_HOST_DEVICE T& operator()(std::int64_t r, std::int64_t c) const { return data[r * cols + c]; }
  // Only for mutable views: nvcc warns about a conversion of MatView<const T> to itself.
  template <class U = T>
  requires(!std::is_const_v<U>) DTRAIN_HOST_DEVICE operator MatView<const U>() const { return {data, rows, cols}; }
};

}  // namespace dtrain
