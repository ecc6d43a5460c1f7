#pragma once
// The Precision slot: Precision<Param, Reduce = fp32>.
//
//   param_type   dtype of the parameters units compute with (fp32, bf16, fp16)
//   reduce_type  dtype gradients travel in through the communicator
//   master_type  always fp32: the optimizer updates fp32 master weights, so
//                small updates are not rounded away in a 16-bit parameter
//   loss_scaling true for fp16 params: fp16's narrow exponent range needs a
//                dynamically scaled loss to keep gradients from underflowing
//
// Valid (Param, Reduce) pairs: Reduce is fp32, or Reduce is Param, or
// (fp32, bf16) to halve gradient traffic (bf16 keeps fp32's range). Rejected:
//   (fp32 or bf16, fp16) gradients without loss scaling over- or underflow fp16
//   (fp16, bf16)         bf16 keeps fewer mantissa bits than fp16 at the same
//                        size, and loss-scaled fp16 gradients already fit fp16

#include <type_traits>

#include "dtrain/core/dtype.hpp"

namespace dtrain {

namespace detail {
enum class precision_problem { none, param_not_dtype, reduce_not_dtype, fp16_reduce_unscaled, bf16_reduce_of_fp16 };

// The first problem only, so a bad Precision reports exactly one static_assert.
// A variable template, as in policies.hpp (GCC 13 under nvcc).
template <class Param, class Reduce>
inline constexpr precision_problem check_precision =
    !Dtype<Param>                                                    ? precision_problem::param_not_dtype
    : !Dtype<Reduce>                                                 ? precision_problem::reduce_not_dtype
    : (std::is_same_v<Reduce, fp16> && !std::is_same_v<Param, fp16>) ? precision_problem::fp16_reduce_unscaled
    : (std::is_same_v<Reduce, bf16> && std::is_same_v<Param, fp16>)  ? precision_problem::bf16_reduce_of_fp16
                                                                     : precision_problem::none;

template <precision_problem Problem>
struct precision_diagnostic {
  static_assert(Problem != precision_problem::param_not_dtype,
                "dtrain: Precision<P, Reduce>: P must be a dtype: fp32, bf16 or fp16");
  static_assert(Problem != precision_problem::reduce_not_dtype,
                "dtrain: Precision<P, Reduce>: Reduce must be a dtype: fp32, bf16 or fp16");
  static_assert(Problem != precision_problem::fp16_reduce_unscaled,
                "dtrain: Precision<P, fp16> is not supported unless P is fp16: only fp16 params use loss "
                "scaling, without it gradients over- or underflow fp16; reduce in bf16 or fp32");
  static_assert(Problem != precision_problem::bf16_reduce_of_fp16,
                "dtrain: Precision<fp16, bf16> is not supported: bf16 keeps fewer mantissa bits than fp16 "
                "and loss-scaled fp16 gradients fit fp16; reduce in fp16 or fp32");
};
}  // namespace detail

template <class Param, class Reduce = fp32>
struct Precision {
  using param_type = Param;
  using reduce_type = Reduce;
  using master_type = fp32;
  static constexpr bool loss_scaling = std::is_same_v<Param, fp16>;

 private:
  // The check lives in another class so a failure leaves Precision usable (see policies.hpp).
  static constexpr detail::precision_diagnostic<detail::check_precision<Param, Reduce>> diagnostic{};
};

namespace detail {
// Matched on the template's shape, without instantiating Precision<...>: policies<>
// files Precision<fp16, bf16> under this slot and Precision's own check reports it.
template <class P>
inline constexpr bool is_precision_slot = false;
template <class Param, class Reduce>
inline constexpr bool is_precision_slot<Precision<Param, Reduce>> = true;

template <class P>
inline constexpr bool is_precision_policy = false;
template <class Param, class Reduce>
inline constexpr bool is_precision_policy<Precision<Param, Reduce>> =
    check_precision<Param, Reduce> == precision_problem::none;
}  // namespace detail

template <class P>
concept PrecisionPolicy = detail::is_precision_policy<P>;

}  // namespace dtrain
