#pragma once
// Sums of a few host numbers over every rank, through the device's
// communicator (the one the strategies share): the step's loss normaliser
// (targets, samples, positions), its loss and the stop flag in one
// collective; an evaluation's sums in another. In fp32, as every rank's
// copy must round alike.

#include <array>
#include <cstddef>
#include <vector>

#include "dtrain/comm/binding.hpp"
#include "dtrain/device/buffer.hpp"

namespace dtrain {

template <class Dev>
class RankSums {
  using binding = CommBinding<Dev>;

 public:
  // The most values one step sums at once (sum_step).
  static constexpr std::size_t max_step_values = 5;

  RankSums(Dev& dev, typename binding::comm_type& comm)
      : dev_(dev), comm_(comm), staging_(make_buffer<float>(dev, max_step_values)) {}

  // The step's sums, through a staging buffer made once.
  template <std::size_t N>
  std::array<double, N> sum_step(std::array<double, N> values) {
    static_assert(N <= max_step_values, "RankSums::sum_step: raise max_step_values, the staging buffer's size");
    std::array<float, N> f{};
    for (std::size_t i = 0; i < N; ++i) f[i] = static_cast<float>(values[i]);
    dev_.copy_from_host(staging_.data(), f.data(), N);
    auto w = binding::all_reduce(comm_, dev_, staging_.span().first(N), reduce_op::sum);
    binding::join(w, dev_);
    dev_.copy_to_host(f.data(), staging_.data(), N);
    for (std::size_t i = 0; i < N; ++i) values[i] = f[i];
    return values;
  }

  // Any number of values (an evaluation's: not on every step).
  std::vector<double> sum(std::vector<double> values) {
    std::vector<float> f(values.begin(), values.end());
    auto staging = make_buffer<float>(dev_, f.size());
    dev_.copy_from_host(staging.data(), f.data(), f.size());
    auto w = binding::all_reduce(comm_, dev_, staging.span(), reduce_op::sum);
    binding::join(w, dev_);
    dev_.copy_to_host(f.data(), staging.data(), f.size());
    for (std::size_t i = 0; i < f.size(); ++i) values[i] = f[i];
    return values;
  }

 private:
  Dev& dev_;
  typename binding::comm_type& comm_;
  typename Dev::template buffer<float> staging_;
};

}  // namespace dtrain
