#pragma once
// A micro-batch: named tensors of any element type and shape.
//
//   "x"       the model's input: float features [B, F] or [B, T, F], or
//             integer token ids [B, T] (int32/int64) for a model whose first
//             unit is an input unit (nn::Embedding)
//   "y"       the target the loss reads: class ids [B], token ids [B, T],
//             float regression targets [B, D] or [B*T, D]
//   anything  else a unit or loss asks for by name ("weight", a second input
//             of a custom input unit, ...)
//
//   auto b = dtrain::Batch::table(x, y, rows, features);       // the classic [B, F] + int32 [B]
//   b.set("x", dtrain::HostTensor::of(tokens, {B, T}));         // token ids
//   std::span<const float> v = b.at("y").values<float>();
//
// Batch holds them on the host. The Trainer copies each to the device once
// per micro-batch; units and losses read them through DeviceBatch, whose
// views keep the host copy's address too, for work that is cheaper on the
// host (validating labels, bucketing token ids).
//
//   const DeviceTensor& y = batch.at("y");
//   const std::int32_t* labels = y.data<std::int32_t>();   // throws if y is not int32

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

// A host tensor: element type, shape (row-major) and the bytes.
struct HostTensor {
  element_type type = element_type::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;

  template <class E>
  requires is_element<E>
  static HostTensor of(std::span<const E> values, std::vector<std::int64_t> shape) {
    HostTensor t{element_type_of<E>(), std::move(shape), {}};
    if (t.numel() != static_cast<std::int64_t>(values.size()))
      throw config_error(
          "HostTensor::of: " + std::to_string(values.size()) + " values for shape " + shape_text(t.shape),
          "pass product(shape) values");
    t.bytes.resize(values.size_bytes());
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), values.size_bytes());
    return t;
  }
  template <class E>
  requires is_element<E>
  static HostTensor of(const std::vector<E>& values, std::vector<std::int64_t> shape) {
    return of(std::span<const E>(values), std::move(shape));
  }

  DTRAIN_DECL std::int64_t numel() const;
  std::int64_t dim(std::size_t i) const { return i < shape.size() ? shape[i] : 1; }

  template <class E>
  requires is_element<E> std::span<const E> values()
  const {
    check<E>();
    return {reinterpret_cast<const E*>(bytes.data()), bytes.size() / sizeof(E)};
  }
  template <class E>
  requires is_element<E> std::span<E> values() {
    check<E>();
    return {reinterpret_cast<E*>(bytes.data()), bytes.size() / sizeof(E)};
  }

 private:
  template <class E>
  void check() const {
    if (type != element_type_of<E>())
      throw config_error("a batch tensor of element type " + std::string(element_name(type)) + " was read as " +
                             std::string(element_name(element_type_of<E>())),
                         "read it with its own element type (HostTensor::type)");
  }
};

struct Batch {
  std::map<std::string, HostTensor, std::less<>> tensors;
  std::vector<std::int64_t> indices;  // the data set rows gathered, in order (loaders fill it)

  // The classic classification table: float features x [rows, features] and
  // int32 class labels y [rows].
  DTRAIN_DECL static Batch table(std::span<const float> x, std::span<const std::int32_t> y, std::int64_t rows,
                                 std::int64_t features);

  void set(std::string name, HostTensor t) { tensors.insert_or_assign(std::move(name), std::move(t)); }
  bool contains(std::string_view name) const { return tensors.find(name) != tensors.end(); }

  DTRAIN_DECL const HostTensor& at(std::string_view name) const;
  DTRAIN_DECL HostTensor& at(std::string_view name);

  // Samples in the batch: the leading dimension of "x".
  std::int64_t rows() const { return at("x").dim(0); }

 private:
  DTRAIN_DECL config_error missing(std::string_view name) const;
};

struct DeviceTensor {
  element_type type = element_type::f32;
  std::vector<std::int64_t> shape;
  const std::byte* device = nullptr;  // on the compute device
  const std::byte* host = nullptr;    // the batch's host copy
  std::string name;

  DTRAIN_DECL std::int64_t numel() const;
  std::int64_t dim(std::size_t i) const { return i < shape.size() ? shape[i] : 1; }

  template <class E>
  requires is_element<E>
  const E* data() const {
    check<E>();
    return reinterpret_cast<const E*>(device);
  }
  template <class E>
  requires is_element<E>
  const E* host_data() const {
    check<E>();
    return reinterpret_cast<const E*>(host);
  }

 private:
  template <class E>
  void check() const {
    if (type != element_type_of<E>())
      throw config_error("batch tensor '" + name + "' " + shape_text(shape) + " holds " +
                             std::string(element_name(type)) + " but is read as " +
                             std::string(element_name(element_type_of<E>())),
                         "give the tensor the element type the unit or loss expects");
  }
};

class DeviceBatch {
 public:
  DTRAIN_DECL void set(std::string name, DeviceTensor t);
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  DTRAIN_DECL const DeviceTensor& at(std::string_view name) const;
  DTRAIN_DECL const DeviceTensor* find(std::string_view name) const;

 private:
  std::map<std::string, DeviceTensor, std::less<>> tensors_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/core/tensor.ipp"
#endif
