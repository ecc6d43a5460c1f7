#pragma once
// DDP: every rank holds the whole model; gradients are summed across ranks
// bucket by bucket while backward still runs on earlier units.
//
// Data flow of one optimizer step (Accumulate<A> micro-batches):
//   count   all-reduce the step's sample count (the loss normaliser)
//   k < A   forward all units -> loss -> backward in reverse; each unit's
//           gradient (compute dtype T) is added into the fp32 accumulator
//   k = A-1 as soon as the units of a bucket are done, the bucket's slice is
//           cast to the reduce dtype R (if R != fp32) and all-reduced (sum)
//           asynchronously; only this last micro-batch communicates
//   step    join the buckets, unscale, (fp16) skip on inf/NaN, clip, and run
//           one fused optimizer pass over the flat fp32 master weights that
//           also writes the compute-dtype copy.
// The loss normaliser (global sample count) and the loss scale are folded
// into dlogits, so the summed gradient is exactly the gradient of the mean
// loss over all samples of all ranks and micro-batches (DESIGN.md §4.1, §4.3).

#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/strategy/comm_binding.hpp"

namespace dtrain {

// Reduces a flat fp32 gradient buffer across ranks, one collective per
// bucket, started as soon as backward has finished the bucket's last unit.
// Public so a hand-written training loop can use it without the Trainer.
template <class Dev, Dtype R = float>
class GradReducer {
 public:
  using binding = CommBinding<Dev>;

  // grads: the fp32 flat gradient laid out as in ModelLayout (reverse unit
  // order). When R is not fp32 the reducer owns a staging buffer in R.
  GradReducer(Dev& dev, typename binding::comm_type& comm, std::vector<Bucket> buckets, float* grads,
              [[maybe_unused]] std::size_t numel)
      : dev_(dev), comm_(comm), buckets_(std::move(buckets)), grads_(grads) {
    if constexpr (!std::is_same_v<R, float>) staging_ = make_buffer<R>(dev_, numel);
  }

  // Backward finished unit u of the communicating micro-batch.
  void unit_done(std::size_t u) {
    while (next_ < buckets_.size() && buckets_[next_].last_unit == u) launch(buckets_[next_++]);
  }

  // Waits for every bucket; afterwards grads holds the sum over ranks.
  void finish() {
    for (auto& w : works_) binding::join(w, dev_);
    if constexpr (!std::is_same_v<R, float>)
      for (const Bucket& b : buckets_)
        dev_.for_each(b.size, Cast<R, float>{staging_.data() + b.offset, grads_ + b.offset});
    works_.clear();
    next_ = 0;
  }

 private:
  void launch(const Bucket& b) {
    if (b.size == 0) return;
    if constexpr (std::is_same_v<R, float>) {
      works_.push_back(binding::all_reduce(comm_, dev_, std::span<float>(grads_ + b.offset, b.size), reduce_op::sum));
    } else {
      dev_.for_each(b.size, Cast<float, R>{grads_ + b.offset, staging_.data() + b.offset});
      works_.push_back(binding::all_reduce(comm_, dev_, std::span<R>(staging_.data() + b.offset, b.size), reduce_op::sum));
    }
  }

  Dev& dev_;
  typename binding::comm_type& comm_;
  std::vector<Bucket> buckets_;
  float* grads_;
  typename Dev::template buffer<R> staging_;
  std::vector<typename binding::work_type> works_;
  std::size_t next_ = 0;
};

}  // namespace dtrain
