#pragma once
// Device batches for tests that drive a loss directly: one int32 tensor of
// labels, copied into `storage` on the device. `labels` (the host copy the
// view keeps) and `storage` must outlive the returned batch.

#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/core/tensor.hpp>
#include <dtrain/device/buffer.hpp>

namespace dtrain::testing {

template <class Dev>
DeviceBatch label_batch(Dev& dev, const std::vector<std::int32_t>& labels,
                        typename Dev::template buffer<std::int32_t>& storage, std::string name = "y") {
  storage = make_buffer<std::int32_t>(dev, labels.size());
  dev.copy_from_host(storage.data(), labels.data(), labels.size());
  DeviceBatch b;
  b.set(std::move(name), DeviceTensor{element_type::i32,
                                      {static_cast<std::int64_t>(labels.size())},
                                      reinterpret_cast<const std::byte*>(storage.data()),
                                      reinterpret_cast<const std::byte*>(labels.data()),
                                      {}});
  return b;
}

}  // namespace dtrain::testing
