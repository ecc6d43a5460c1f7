// The definitions tensor.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/core/tensor.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL auto HostTensor::numel() const->std::int64_t {
    return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>{});
  }

  DTRAIN_DECL auto Batch::table(std::span<const float> x, std::span<const std::int32_t> y, std::int64_t rows,
                                std::int64_t features)
      ->Batch {
    Batch b;
    b.set("x", HostTensor::of(x, {rows, features}));
    b.set("y", HostTensor::of(y, {rows}));
    return b;
  }

  DTRAIN_DECL auto Batch::at(std::string_view name) const->const HostTensor& {
    const auto it = tensors.find(name);
    if (it == tensors.end()) throw missing(name);
    return it->second;
  }

  DTRAIN_DECL auto Batch::at(std::string_view name)->HostTensor& {
    const auto it = tensors.find(name);
    if (it == tensors.end()) throw missing(name);
    return it->second;
  }

  DTRAIN_DECL auto Batch::missing(std::string_view name) const->config_error {
    std::string have;
    for (const auto& [n, t] : tensors) have += (have.empty() ? "" : ", ") + n + " " + shape_text(t.shape);
    return config_error(
        "the batch has no tensor '" + std::string(name) + "' (it has: " + (have.empty() ? "nothing" : have) + ")",
        "put the model's input in \"x\" and the loss's target in \"y\" (Batch::set), or name the "
        "tensors the unit or loss reads");
  }

  DTRAIN_DECL auto DeviceTensor::numel() const->std::int64_t {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }

  DTRAIN_DECL auto DeviceBatch::set(std::string name, DeviceTensor t)->void {
    t.name = name;
    tensors_.insert_or_assign(std::move(name), std::move(t));
  }

  DTRAIN_DECL auto DeviceBatch::at(std::string_view name) const->const DeviceTensor& {
    const auto it = tensors_.find(name);
    if (it != tensors_.end()) return it->second;
    std::string have;
    for (const auto& [n, t] : tensors_) have += (have.empty() ? "" : ", ") + n;
    throw config_error(
        "the batch has no tensor '" + std::string(name) + "' (it has: " + (have.empty() ? "nothing" : have) + ")",
        "give every micro-batch the tensors its model's input unit and loss read");
  }

  DTRAIN_DECL auto DeviceBatch::find(std::string_view name) const->const DeviceTensor* {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
}  // namespace dtrain
DTRAIN_IMPL_END
