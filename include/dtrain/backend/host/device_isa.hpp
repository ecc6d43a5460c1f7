#pragma once
// The vector instructions the host's functor loops run with, chosen at run
// time. dtrain is header-only and compiled with the user's flags, which for a
// portable binary means x86-64's baseline (SSE2, four floats per
// instruction, no fused multiply-add). Host::for_each therefore compiles
// every functor loop three times, for the baseline, for AVX2 + FMA and for
// AVX-512, and runs the widest the processor has: the same source, vectorised
// by the compiler at each width, with no flag the user must know.
//
// Results: a functor computes the same thing at every level, but fused
// multiply-adds round once where the baseline rounds twice, so results differ
// between levels by rounding, as they do between the host and the GPU. On
// one machine the level is fixed, so runs stay bit-reproducible. To compare
// runs across machines bit for bit, pin the level everywhere with
// DTRAIN_HOST_ISA=baseline (or avx2, avx512: a level the processor lacks is
// an error, not a silent fallback).
//
// Off x86-64, or with a compiler other than GCC and Clang, there is one level
// (the compiler's own) and DTRAIN_HOST_ISA accepts only "baseline".

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dtrain/backend/host/device_tuning.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(__CUDA_ARCH__)
#define DTRAIN_HOST_ISA_DISPATCH 1
#else
#define DTRAIN_HOST_ISA_DISPATCH 0
#endif

namespace dtrain {

enum class host_isa { baseline, avx2, avx512 };

inline const char* host_isa_name(host_isa isa) {
  switch (isa) {
    case host_isa::avx2: return "avx2";
    case host_isa::avx512: return "avx512";
    default: return "baseline";
  }
}

namespace detail {

// The widest level this processor runs (AVX2 needs FMA as well; AVX-512
// needs the F, VL, BW and DQ subsets GCC uses for float and integer lanes).
DTRAIN_DECL host_isa widest_host_isa();

// DTRAIN_HOST_ISA, or the widest level when unset.
DTRAIN_DECL host_isa host_isa_from_env();

inline host_isa& host_isa_slot() {
  static host_isa isa = host_isa_from_env();
  return isa;
}

}  // namespace detail

// The level Host's functor loops run with in this process.
inline host_isa current_host_isa() { return detail::host_isa_slot(); }

// Pins the level for the rest of the process (tests compare the levels);
// a level the processor lacks is a config_error.
DTRAIN_DECL void set_host_isa(host_isa isa);

namespace detail {

// f(i) for i in [begin, end) on the calling thread, compiled for each level.
// The functor's call operator carries no target of its own; `flatten` has the
// compiler inline it (and what it calls) into each copy, so its loops are
// vectorised for that copy's level even where the size heuristics would
// leave a large operator out of line, compiled for the baseline. Each copy
// runs a local copy of f: through the reference, every member would be
// reloaded after each store the compiler cannot prove does not hit the
// functor, and AdamW's dozen coefficients then need more run-time alias
// checks than GCC makes (10), so the loop stayed scalar.
//
// A functor whose index stands for a position in rows (i / cols, i % cols)
// pays a 64-bit division per element, and the division keeps the loop
// scalar. Such a functor may also define span(begin, end): the same work as
// f(i) for every i in [begin, end), any sub-range, written as loops over
// whole rows (one division per row, contiguous inner loops the compiler
// vectorises) and computing each element with the same operations, so the
// bits are those of f(i). The host runs span where there is one; a GPU
// always calls f(i), one index per thread.
template <class F>
concept HostSpanFunctor = requires(F& f, std::size_t i) {
  f.span(i, i);
};

template <class F>
DTRAIN_ALWAYS_INLINE void run_indices(F& f, std::size_t begin, std::size_t end) {
  if constexpr (HostSpanFunctor<F>) {
    f.span(begin, end);
  } else {
    for (std::size_t i = begin; i < end; ++i) f(i);
  }
}

template <class F>
DTRAIN_FLATTEN void run_range_baseline(const F& f, std::size_t begin, std::size_t end) {
  F local = f;
  run_indices(local, begin, end);
}

#if DTRAIN_HOST_ISA_DISPATCH
template <class F>
__attribute__((flatten, target("avx2,fma"))) void run_range_avx2(const F& f, std::size_t begin, std::size_t end) {
  F local = f;
  run_indices(local, begin, end);
}

template <class F>
__attribute__((flatten, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void run_range_avx512(const F& f,
                                                                                                      std::size_t begin,
                                                                                                      std::size_t end) {
  F local = f;
  run_indices(local, begin, end);
}
#endif

// The sum of f(i) over [begin, end) in double, compiled for each level as
// run_range is: HostTuning::sum_lanes independent partial sums in a fixed
// order (element i goes to partial i % sum_lanes, the partials are added
// pairwise at the end), so the result depends only on the inputs and the
// level (fused multiply-adds round once), never on timing or threads.
template <class F>
DTRAIN_ALWAYS_INLINE double sum_lanes(const F& f, std::size_t begin, std::size_t end) {
  constexpr std::size_t w = HostTuning::sum_lanes;
  double lane[w] = {};
  const std::size_t whole = begin + (end - begin) / w * w;
  std::size_t i = begin;
  for (; i < whole; i += w)
    for (std::size_t k = 0; k < w; ++k) lane[k] += static_cast<double>(f(i + k));
  double tail = 0.0;
  for (; i < end; ++i) tail += static_cast<double>(f(i));
  for (std::size_t half = w / 2; half > 0; half /= 2)
    for (std::size_t k = 0; k < half; ++k) lane[k] += lane[k + half];
  return lane[0] + tail;
}

template <class F>
DTRAIN_FLATTEN double sum_range_baseline(const F& f, std::size_t begin, std::size_t end) {
  const F local = f;
  return sum_lanes(local, begin, end);
}

#if DTRAIN_HOST_ISA_DISPATCH
template <class F>
__attribute__((flatten, target("avx2,fma"))) double sum_range_avx2(const F& f, std::size_t begin, std::size_t end) {
  const F local = f;
  return sum_lanes(local, begin, end);
}

template <class F>
__attribute__((flatten, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) double sum_range_avx512(
    const F& f, std::size_t begin, std::size_t end) {
  const F local = f;
  return sum_lanes(local, begin, end);
}
#endif

template <class F>
double sum_range(const F& f, std::size_t begin, std::size_t end) {
#if DTRAIN_HOST_ISA_DISPATCH
  switch (current_host_isa()) {
    case host_isa::avx512: return sum_range_avx512(f, begin, end);
    case host_isa::avx2: return sum_range_avx2(f, begin, end);
    default: break;
  }
#endif
  return sum_range_baseline(f, begin, end);
}

template <class F>
void run_range(const F& f, std::size_t begin, std::size_t end) {
#if DTRAIN_HOST_ISA_DISPATCH
  switch (current_host_isa()) {
    case host_isa::avx512: return run_range_avx512(f, begin, end);
    case host_isa::avx2: return run_range_avx2(f, begin, end);
    default: break;
  }
#endif
  run_range_baseline(f, begin, end);
}

}  // namespace detail

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/host/device_isa.ipp"
#endif
