#pragma once
// The user-model concepts.
//
// A model is an ordered sequence of units plus a loss. A unit is the grain of
// everything the library does: one flat parameter buffer, one gradient
// bucket boundary, one FSDP wrap unit, one activation-checkpoint region. A
// unit declares its parameters and computes forward and backward on views; it
// never allocates parameters, gradients or activations (the library owns
// them all).
//
//   struct MyUnit {
//     std::vector<dtrain::ParamSpec> params() const;           // declaration order = layout order
//     std::int64_t out_features(std::int64_t in) const;        // shape inference
//     template <class Dev, class T>
//     void forward(Dev&, dtrain::UnitParams<const T>, dtrain::MatView<const T> x, dtrain::MatView<T> y);
//     template <class Dev, class T>
//     void backward(Dev&, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad,
//                   dtrain::MatView<const T> x, dtrain::MatView<const T> y,
//                   dtrain::MatView<const T> dy, dtrain::MatView<T> dx);
//   };
//
// Activations are [rows, width] matrices; for sequences rows = batch * time
// (row b * time + t). A unit that needs more than that takes a UnitContext<T>
// as a last argument of forward and backward:
//   ctx.shape   the sequence shape of its input rows (attention needs the
//               time axis)
//   ctx.saved   activations the unit keeps from forward for backward: a view
//               of saved_size(shape, in) elements of T, which it declares
//                 std::int64_t saved_size(dtrain::SeqShape, std::int64_t in) const;
//               (a composite unit: a transformer block's inner activations).
//               With activation checkpointing the library drops them after
//               forward and calls forward again right before backward.
//
// The first unit may be an input unit: instead of x it reads the batch's
// tensors (token ids, several inputs) on the device:
//     void forward(Dev&, UnitParams<const T>, const dtrain::DeviceBatch&, MatView<T> y, const UnitContext<T>&);
//     void backward(Dev&, UnitParams<const T>, UnitParams<T> grad, const dtrain::DeviceBatch&,
//                   MatView<const T> y, MatView<const T> dy, const UnitContext<T>&);
//
// A unit may change the row count (a vision tower's patch embedding turns B
// images into B * tokens rows; a multimodal merge turns B * patches image
// rows into B * T text rows) by declaring the sequence shape it writes:
//     dtrain::SeqShape out_shape(dtrain::SeqShape in, dtrain::SeqShape batch) const;
// `in` is the shape of the rows it reads (the previous unit's out_shape; for
// the first unit the micro-batch's shape), `batch` the micro-batch's shape
// (from its "x"). Without the member a unit writes the rows it reads. The
// library sizes each unit's output, its gradient and its saved view
// (saved_size(in, width)) by this chain; ctx.shape is `in`, y and dy have
// out_shape(...).rows() rows, x and dx in.rows(), and the loss sees the last
// unit's rows.
//
// Lanes: activations that skip units (a UNet's skip connections, a time
// embedding every block of a diffusion model reads). One unit writes lane
// `id` in forward, declaring its size from its input's:
//     std::vector<dtrain::LaneSpec> lanes_written(dtrain::SeqShape in, std::int64_t in_width) const;
// later units read it, declaring
//     std::vector<int> lanes_read() const;
// and both reach it through ctx.lane(id) (a context unit). The library keeps
// each lane for the whole forward and backward of a micro-batch (written
// once, like the activation between two units) and a gradient beside it,
// zeroed before backward: a reader ADDS its gradient for the lane into
// ctx.lane_grad(id) in backward; the writer, whose backward comes after
// every reader's, adds what was summed there into its own input gradient.
// A recomputed forward (activation checkpointing) writes the same values.
//
// backward OVERWRITES grad[i] with this micro-batch's gradient; grad[i] is
// empty (data == nullptr) for a frozen parameter, which the unit must skip.
// dx is empty for the first unit (no input gradient is needed there).
// The loss normaliser is already folded into dy by the library.
//
// A model:
//   struct MyModel {
//     auto units() { return std::tie(l1, act, l2); }   // a tuple of unit references
//     dtrain::nn::SoftmaxCrossEntropy loss;             // or any Loss
//   };
// A tuple element may also be a range of units (std::vector<Block>&): N
// identical blocks, or layers whose number is only known at run time
// (std::vector<dtrain::nn::AnyUnit>). Units are numbered in order, ranges
// expanded; "<number>.<param>" names every parameter.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"

namespace dtrain {

// The parameters (or gradients) of one unit, in declaration order.
template <class T>
using UnitParams = std::span<const MatView<T>>;

// The shape of the rows a unit sees: rows = batch * time.
struct SeqShape {
  std::int64_t batch = 1;
  std::int64_t time = 1;
  std::int64_t rows() const { return batch * time; }
  friend bool operator==(SeqShape, SeqShape) = default;
};

// A lane a unit writes (see above): `rows` x `width` elements of T.
struct LaneSpec {
  int id = 0;
  std::int64_t rows = 0;
  std::int64_t width = 0;
};

// The lanes of one micro-batch, by id: their values and their gradients.
template <class T>
struct Lanes {
  std::vector<MatView<T>> value;
  std::vector<MatView<T>> grad;
};

// An attention unit's key-value cache for generation (nn/kv_cache.hpp,
// train/generate.hpp): the keys and values of the positions decoded so far,
// [batch, kv_heads, capacity, head_dim] each on the compute device, sized
// by the unit on its first cached call. The Trainer's pipeline holds one
// per unit (a unit holds at most one causal self-attention).
template <class T>
struct KvSlot {
  std::int64_t capacity = 0;  // positions per sequence
  std::size_t size = 0;       // elements of k and of v
  T* k = nullptr;
  T* v = nullptr;
  std::shared_ptr<void> storage;  // the device buffers k and v point into
};

// What a unit may need beyond its parameters and activations (see above):
// the sequence shape, its saved view, whether this is a training forward
// (false for evaluate() and predict()), and its random stream. A unit that
// draws random numbers (nn::Dropout) takes them from `stream` and the
// element index only (detail::uniform01), so a forward recomputed under
// activation checkpointing, and a run resumed from a checkpoint, draw the
// same ones. The Trainer derives the stream from the seed, the rank, the
// step, the micro-batch and the unit. `batch` is the micro-batch's tensors
// on the device (null outside the Trainer), for a unit that reads more than
// its input: attention reads "attention_mask" there. `adapters` false runs
// the model as its base: every LoRA adapter is left out of the forward
// (the reference of a preference loss, Trainer::sequence_logps). `kv` set:
// a cached call (generation): the rows are new tokens at the batch's
// "position_ids", and the unit's attention reads and extends this cache.
template <class T>
struct UnitContext {
  SeqShape shape{};
  MatView<T> saved{};
  bool training = false;
  std::uint64_t stream = 0;
  const DeviceBatch* batch = nullptr;
  const Lanes<T>* lanes = nullptr;  // the micro-batch's lanes (null outside the Trainer)
  bool adapters = true;             // false: LoRA adapters off (a forward of the base model)
  KvSlot<T>* kv = nullptr;          // a cached call's key-value cache (generation)

  // The context of part `i` of a composite unit: its own saved view, the
  // same mode, batch, lanes, adapters and cache, and a stream of its own.
  UnitContext part(MatView<T> part_saved, std::uint64_t i) const {
    return {shape, part_saved, training, detail::derive_stream(stream, i), batch, lanes, adapters, kv};
  }

  // Lane `id`'s values, and in backward the gradient readers add into.
  MatView<T> lane(int id) const { return lane_of(id, false); }
  MatView<T> lane_grad(int id) const { return lane_of(id, true); }

 private:
  MatView<T> lane_of(int id, bool grad) const {
    // (a declared lane has a width; its rows may be 0 on a rank with no data left)
    if (lanes == nullptr || id < 0 || static_cast<std::size_t>(id) >= lanes->value.size() ||
        lanes->value[static_cast<std::size_t>(id)].cols == 0)
      throw config_error("a unit reads lane " + std::to_string(id) + ", which no earlier unit of the model writes",
                         "declare it in the writing unit's lanes_written() and the reader's lanes_read(), and run the "
                         "model through the Trainer");
    return grad ? lanes->grad[static_cast<std::size_t>(id)] : lanes->value[static_cast<std::size_t>(id)];
  }
};

template <class U>
concept UnitDeclaration = requires(const U& u, std::int64_t in) {
  { u.params() } -> std::convertible_to<std::vector<ParamSpec>>;
  { u.out_features(in) } -> std::convertible_to<std::int64_t>;
};

namespace detail {
template <class U, class Dev, class T>
concept plain_unit = requires(U& u, Dev& dev, UnitParams<const T> p, UnitParams<T> g, MatView<const T> cx,
                              MatView<T> x) {
  u.template forward<Dev, T>(dev, p, cx, x);
  u.template backward<Dev, T>(dev, p, g, cx, cx, cx, x);
};
template <class U, class Dev, class T>
concept context_unit = requires(U& u, Dev& dev, UnitParams<const T> p, UnitParams<T> g, MatView<const T> cx,
                                MatView<T> x, const UnitContext<T>& ctx) {
  u.template forward<Dev, T>(dev, p, cx, x, ctx);
  u.template backward<Dev, T>(dev, p, g, cx, cx, cx, x, ctx);
};
}  // namespace detail

// A unit whose forward reads the batch itself (the first unit of a model
// over token ids or several inputs).
template <class U, class Dev, class T>
concept InputUnit = UnitDeclaration<U> &&
    requires(U& u, Dev& dev, UnitParams<const T> p, UnitParams<T> g, const DeviceBatch& b, MatView<const T> cx,
             MatView<T> x, const UnitContext<T>& ctx) {
  u.template forward<Dev, T>(dev, p, b, x, ctx);
  u.template backward<Dev, T>(dev, p, g, b, cx, cx, ctx);
};

// A Unit usable on device Dev with compute dtype T.
template <class U, class Dev, class T>
concept Unit = UnitDeclaration<U> &&
    (detail::plain_unit<U, Dev, T> || detail::context_unit<U, Dev, T> || InputUnit<U, Dev, T>);

namespace detail {
// How a unit is called: the one place that tells input, context and plain
// units apart. The caller passes everything any form takes; each form uses
// what it reads (an input unit reads the batch instead of x).
template <class Dev, class T, class U>
void unit_forward(U& unit, Dev& dev, UnitParams<const T> p, const DeviceBatch& batch, MatView<const T> x, MatView<T> y,
                  const UnitContext<T>& ctx) {
  if constexpr (InputUnit<U, Dev, T>)
    unit.template forward<Dev, T>(dev, p, batch, y, ctx);
  else if constexpr (context_unit<U, Dev, T>)
    unit.template forward<Dev, T>(dev, p, x, y, ctx);
  else
    unit.template forward<Dev, T>(dev, p, x, y);
}

template <class Dev, class T, class U>
void unit_backward(U& unit, Dev& dev, UnitParams<const T> p, UnitParams<T> g, const DeviceBatch& batch,
                   MatView<const T> x, MatView<const T> y, MatView<const T> dy, MatView<T> dx,
                   const UnitContext<T>& ctx) {
  if constexpr (InputUnit<U, Dev, T>)
    unit.template backward<Dev, T>(dev, p, g, batch, y, dy, ctx);
  else if constexpr (context_unit<U, Dev, T>)
    unit.template backward<Dev, T>(dev, p, g, x, y, dy, dx, ctx);
  else
    unit.template backward<Dev, T>(dev, p, g, x, y, dy, dx);
}
}  // namespace detail

// The sequence shape of the rows a unit writes (its input's unless it says, above).
template <class U>
SeqShape out_shape_of(const U& u, SeqShape in, SeqShape batch) {
  if constexpr (requires {
                  { u.out_shape(in, batch) } -> std::convertible_to<SeqShape>;
                })
    return u.out_shape(in, batch);
  else
    return in;
}

// Elements of T a unit keeps from forward for backward (0 unless it says).
template <class U>
std::int64_t saved_size_of(const U& u, SeqShape shape, std::int64_t in) {
  if constexpr (requires {
                  { u.saved_size(shape, in) } -> std::convertible_to<std::int64_t>;
                })
    return u.saved_size(shape, in);
  else
    return 0;
}

// The same for a call in T on `dev`, for units whose needs depend on the
// kernels the device runs (the attention units keep less under fused
// attention); they declare
//   template <class Dev, class T> std::int64_t saved_size_on(Dev&, SeqShape, std::int64_t in) const;
// and saved_size(shape, in) stays their largest need (what an estimate uses).
template <class T, class U, class Dev>
std::int64_t saved_size_of(const U& u, Dev& dev, SeqShape shape, std::int64_t in) {
  if constexpr (requires {
                  { u.template saved_size_on<Dev, T>(dev, shape, in) } -> std::convertible_to<std::int64_t>;
                })
    return u.template saved_size_on<Dev, T>(dev, shape, in);
  else
    return saved_size_of(u, shape, in);
}

// The lanes a unit writes for input rows `in` of `width` (none unless it says).
template <class U>
std::vector<LaneSpec> lanes_written_of(const U& u, SeqShape in, std::int64_t width) {
  if constexpr (requires {
                  { u.lanes_written(in, width) } -> std::convertible_to<std::vector<LaneSpec>>;
                })
    return u.lanes_written(in, width);
  else
    return {};
}

// The lanes a unit reads (none unless it says).
template <class U>
std::vector<int> lanes_read_of(const U& u) {
  if constexpr (requires {
                  { u.lanes_read() } -> std::convertible_to<std::vector<int>>;
                })
    return u.lanes_read();
  else
    return {};
}

namespace detail {
// A tuple element of units() is either one unit or a range of identical units
// (std::vector<Block>&, std::span<Block>): N transformer blocks, or the
// runtime-sized layers of an MLP. Units are numbered in order, ranges expanded.
template <class E>
concept unit_range = requires(E& e) {
  std::begin(e);
  std::end(e);
  std::rbegin(e);
};

template <class Tuple, class F>
void for_each_unit(Tuple&& units, F&& f) {
  std::size_t i = 0;
  std::apply(
      [&](auto&... elem) {
        (
            [&](auto& e) {
              if constexpr (unit_range<std::remove_cvref_t<decltype(e)>>)
                for (auto& u : e) f(i++, u);
              else
                f(i++, e);
            }(elem),
            ...);
      },
      units);
}

template <class Tuple, class F>
void for_each_unit_reverse(Tuple&& units, std::size_t count, F&& f) {
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Tuple>>;
  std::size_t i = count;
  auto visit = [&](auto& e) {
    if constexpr (unit_range<std::remove_cvref_t<decltype(e)>>)
      for (auto it = std::rbegin(e); it != std::rend(e); ++it) f(--i, *it);
    else
      f(--i, e);
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) { (visit(std::get<n - 1 - I>(units)), ...); }
  (std::make_index_sequence<n>{});
}
}  // namespace detail

// A loss over the last unit's output [rows, width] ("logits") and the
// batch's targets on the device:
//   count(batch)     the loss normaliser this micro-batch contributes, on the
//                    host: its samples, or its targets not ignored; the
//                    Trainer sums it over micro-batches and ranks
//   forward(...)     the SUM of the per-element losses (a host double)
//   backward(...)    d(sum of losses)/dlogits * scale, where
//                    scale = loss_scale / global count
template <class L, class Dev, class T>
concept Loss = requires(L& l, const L& cl, Dev& dev, MatView<const T> logits, const DeviceBatch& b, MatView<T> dlogits,
                        float scale, const Batch& host) {
  { cl.count(host) } -> std::convertible_to<double>;
  { l.template forward<Dev, T>(dev, logits, b) } -> std::convertible_to<double>;
  l.template backward<Dev, T>(dev, logits, b, dlogits, scale);
};

// A loss's own figures beyond the loss (nn::PreferenceLoss: TRL's rewards
// and log-probabilities): sums over what its forward calls saw since it was
// last asked (take_metric_sums()), and the count they are divided by. The
// Trainer takes them in every step and evaluation, sums them over the ranks
// and reports sum / count (StepStats::metrics, EvalResult::metrics), or
// with a sum of squares the standard deviation;
// `logged` ones also go on fit's progress line. Every rank's loss names the
// same figures, in the same order.
struct LossSum {
  std::string name;
  double sum = 0;
  bool logged = false;
  double count = -1;       // >= 0: divided by this instead of LossMetricSums::count
  double square_sum = -1;  // >= 0: the sum of squares: reported as the values' standard deviation (n - 1)
  std::string label{};     // on the log line, when not the name
};
struct LossMetricSums {
  double count = 0;
  std::vector<LossSum> sums;
};

namespace detail {
// The loss's figures (none for a loss without take_metric_sums()).
template <class L>
LossMetricSums take_loss_metrics(L& loss) {
  if constexpr (requires {
                  { loss.take_metric_sums() } -> std::convertible_to<LossMetricSums>;
                })
    return loss.take_metric_sums();
  else
    return {};
}
}  // namespace detail

template <class M>
concept Model = requires(M& m) {
  m.units();
  m.loss;
}
&&requires { std::tuple_size<std::remove_cvref_t<decltype(std::declval<M&>().units())>>::value; };

}  // namespace dtrain
