#pragma once
// Batch tensors that units read themselves (UnitContext::batch), checked
// with errors that name the unit, the tensor and the fix.

#include <cstdint>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"

namespace dtrain::nn::detail {

// A float batch tensor of `count` values, checked.
inline const float* batch_floats(const char* unit, const DeviceBatch* batch, const char* name, std::int64_t count,
                                 const char* fix) {
  const DeviceTensor* t = batch == nullptr ? nullptr : batch->find(name);
  if (t == nullptr) throw config_error(std::string(unit) + ": the batch has no \"" + name + "\"", fix);
  if (t->type != element_type::f32)
    throw config_error(std::string(unit) + ": \"" + name + "\" holds " + std::string(element_name(t->type)),
                       std::string("store ") + name + " as float32");
  if (t->numel() != count)
    throw config_error(std::string(unit) + ": \"" + name + "\" holds " + std::to_string(t->numel()) + " values " +
                           shape_text(t->shape) + ", the model needs " + std::to_string(count),
                       fix);
  return t->data<float>();
}

}  // namespace dtrain::nn::detail
