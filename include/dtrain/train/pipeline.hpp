#pragma once
// The unit pipeline: one micro-batch through the model's units, forward and
// backward, around the strategy's hooks (gathers, reductions). It owns what
// that needs: the batch's tensors on the device, the activations between
// units, what units keep from forward for backward (one buffer each, or with
// activation checkpointing one they take in turn, recomputing right before
// backward), the two input-gradient buffers, the lanes (activations that
// skip units, and their gradients), the tied parameters' splicing and each
// forward's random stream (seed, rank, step, micro-batch, unit).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/fault.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/strategy/any_strategy.hpp"
#include "dtrain/train/recompute.hpp"
#include "dtrain/train/ties.hpp"

namespace dtrain {

// How a forward-only call runs (Trainer::decode, forward_output): with the
// model's LoRA adapters or without them (the base model), and with a
// key-value cache of `cache_positions` positions per sequence (> 0: the
// batch's rows are new tokens at its "position_ids", generation) or none.
struct DecodeOptions {
  bool adapters = true;
  std::int64_t cache_positions = 0;
};

namespace detail {
// What UnitPipeline::forward_output hands the model's output to instead of
// the loss: f(dev, logits on the device, the batch's device tensors).
template <class F>
struct OutputSink {
  F f;
};
template <class F>
inline constexpr bool is_output_sink = false;
template <class F>
inline constexpr bool is_output_sink<OutputSink<F>> = true;
}  // namespace detail

template <Model M, class Dev, class T>
class UnitPipeline {
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  struct Options {
    std::uint64_t seed = 0;       // the random streams' root (TrainerOptions::seed)
    int rank = 0;                 // this rank's streams differ from the others'
    RecomputePolicy recompute{};  // activation checkpointing (train/recompute.hpp)
  };

  UnitPipeline(M& model, Dev& dev, const ModelLayout& layout, AnyStrategy<T>& strategy, Options options)
      : model_(model),
        dev_(dev),
        strategy_(strategy),
        ties_(dev, layout, strategy),
        num_units_(layout.units().size()),
        first_trained_(num_units_),
        options_(options) {
    detail::check_recompute_policy(options.recompute, num_units_);
    for (std::size_t u = 0; u < num_units_ && first_trained_ == num_units_; ++u)
      if (layout.units()[u].train_size > 0) first_trained_ = u;
  }

  // The sequence shape of a micro-batch, from its input "x": float features
  // [B, F] (B rows) or [B, T, F] (B*T rows), or integer ids [B, T] read by an
  // input unit. B = 0 is a rank with no data left; every other extent > 0.
  SeqShape check_batch(const Batch& b) const {
    const HostTensor& x = b.at("x");
    const bool floating = is_floating(x.type);
    const bool extents_ok = !x.shape.empty() && x.shape[0] >= 0 &&
                            std::all_of(x.shape.begin() + 1, x.shape.end(), [](std::int64_t e) { return e >= 1; });
    if (!extents_ok || (floating && x.shape.size() < 2))
      throw config_error("a micro-batch's input x is " + shape_text(x.shape) + " " + std::string(element_name(x.type)),
                         "give x as float features [B, F] or [B, T, F], or integer ids [B, T] for a model whose "
                         "first unit is an input unit (nn::Embedding), with B >= 0 (0: this rank has no data left)");
    if (static_cast<std::int64_t>(x.bytes.size()) != x.numel() * static_cast<std::int64_t>(element_bytes(x.type)))
      throw config_error(
          "a micro-batch's input x " + shape_text(x.shape) + " holds " + std::to_string(x.bytes.size()) + " bytes",
          "build batch tensors with HostTensor::of(values, shape)");
    // The sequence length: the extents between B and the feature width (ids have none).
    std::int64_t seq = 1;
    for (std::size_t i = 1; i + (floating ? 1 : 0) < x.shape.size(); ++i) seq *= x.shape[i];
    return {x.shape[0], seq};
  }

  // Forward and backward of micro-batch k of optimizer step `step` (the one
  // being taken, counted from 1). after_forward(the summed loss) runs
  // between the two and returns the scale of the loss's gradient.
  template <class AfterForward>
  void train(const Batch& batch, std::int64_t step, int k, AfterForward&& after_forward) {
    run(batch, step, k, nullptr, std::forward<AfterForward>(after_forward), true);
  }

  // A forward only: the model's output (the loss's input) copied to *outputs
  // when it is set, then the summed loss given to on_loss unless there is no
  // loss to compute (predict: on_loss = nullptr).
  template <class OnLoss>
  void forward(const Batch& batch, std::int64_t step, std::vector<float>* outputs, OnLoss&& on_loss) {
    run(batch, step, 0, outputs, std::forward<OnLoss>(on_loss), false);
  }

  // A forward only under `mode` (the LoRA adapters on or off; with a
  // key-value cache of mode.cache_positions positions per sequence: the
  // batch's rows are new tokens, nn/kv_cache.hpp), handing the model's
  // output on the device to on_output(dev, MatView<const T> logits, const
  // DeviceBatch&) instead of the loss (Trainer::sequence_logps, decode).
  template <class OnOutput>
  void forward_output(const Batch& batch, std::int64_t step, DecodeOptions mode, OnOutput&& on_output) {
    struct Restore {
      DecodeOptions& mode;
      ~Restore() { mode = {}; }
    } restore{mode_};
    mode_ = mode;
    if (mode.cache_positions > 0) {
      kv_.resize(num_units_);
      for (KvSlot<T>& slot : kv_) slot.capacity = mode.cache_positions;
    }
    run(batch, step, 0, nullptr, detail::OutputSink<OnOutput&>{on_output}, false);
  }

  // Frees the key-value caches of the last cached forwards.
  void release_kv_cache() { kv_.clear(); }

  // The width of the model's output (the loss's input), known after a call.
  std::int64_t output_width() const { return width_.empty() ? 0 : width_.back(); }

 private:
  template <class E>
  void ensure(buffer<E>& b, std::size_t n) {
    if (b.size() < n) b = make_buffer<E>(dev_, n, memory_category::activations);
  }

  bool first_is_input_unit() {
    bool input = false;
    detail::for_each_unit(model_.units(), [&](std::size_t u, auto& unit) {
      if (u == 0) input = InputUnit<std::remove_cvref_t<decltype(unit)>, Dev, T>;
    });
    return input;
  }

  // The batch's tensors on the device. Without an input unit x goes to the
  // first activation in the compute dtype instead.
  DeviceBatch upload(const Batch& batch, bool input_unit) {
    DeviceBatch out;
    for (const auto& [name, t] : batch.tensors) {
      if (name == "x" && !input_unit) {
        upload_input(t);
        continue;
      }
      auto& dst = uploads_[name];
      ensure(dst, t.bytes.size());
      dev_.copy_from_host(dst.data(), t.bytes.data(), t.bytes.size());
      out.set(name, DeviceTensor{t.type, t.shape, dst.data(), t.bytes.data(), {}});
    }
    return out;
  }

  void upload_input(const HostTensor& x) {
    const auto n = static_cast<std::size_t>(x.numel());
    if (x.type == element_type_of<T>()) {
      dev_.copy_from_host(activations_[0].data(), x.values<T>().data(), n);
      return;
    }
    staging_.resize(n);
    const auto convert = [&](auto values) {
      for (std::size_t i = 0; i < n; ++i) staging_[i] = dtype_cast<T>(static_cast<float>(values[i]));
    };
    if (x.type == element_type::f32)
      convert(x.values<float>());
    else if (x.type == element_type::bf16)
      convert(x.values<bf16>());
    else
      convert(x.values<fp16>());
    dev_.copy_from_host(activations_[0].data(), staging_.data(), n);
  }

  // The lanes the units write (model/unit.hpp), sized for this micro-batch,
  // with gradients zeroed for a backward. Each lane has one writer, which
  // comes before every reader.
  template <class Units>
  void make_lanes(Units& units, const std::vector<SeqShape>& seq, const std::vector<std::int64_t>& width,
                  bool backward) {
    std::vector<LaneSpec> specs;
    std::vector<std::size_t> writer;
    const auto where = [](std::size_t u) { return "unit " + std::to_string(u); };
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) {
      for (int id : lanes_read_of(unit)) {
        const bool written = id >= 0 && static_cast<std::size_t>(id) < specs.size() &&
                             specs[static_cast<std::size_t>(id)].width > 0 && writer[static_cast<std::size_t>(id)] < u;
        if (!written)
          throw config_error(where(u) + " reads lane " + std::to_string(id) + ", which no earlier unit writes",
                             "write a lane (lanes_written) in a unit before every unit that reads it");
      }
      for (const LaneSpec& l : lanes_written_of(unit, seq[u], width[u])) {
        if (l.id < 0 || l.rows < 0 || l.width < 1)
          throw config_error(where(u) + " declares lane " + std::to_string(l.id) + " of " + std::to_string(l.rows) +
                                 " x " + std::to_string(l.width),
                             "give a lane an id >= 0 and a width >= 1");
        const auto i = static_cast<std::size_t>(l.id);
        if (i >= specs.size()) {
          specs.resize(i + 1);
          writer.resize(i + 1, num_units_);
        }
        if (specs[i].width > 0)
          throw config_error(
              where(u) + " writes lane " + std::to_string(l.id) + ", which " + where(writer[i]) + " writes too",
              "give each lane one writer (one id per lane)");
        specs[i] = l;
        writer[i] = u;
      }
    });
    lane_values_.resize(specs.size());
    lane_grads_.resize(specs.size());
    lanes_.value.assign(specs.size(), MatView<T>{});
    lanes_.grad.assign(specs.size(), MatView<T>{});
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].width == 0) continue;
      const auto n = static_cast<std::size_t>(specs[i].rows * specs[i].width);
      ensure(lane_values_[i], n);
      lanes_.value[i] = lane_values_[i].view(specs[i].rows, specs[i].width);
      if (!backward) continue;
      ensure(lane_grads_[i], n);
      dev_.zero(lane_grads_[i].data(), n);
      lanes_.grad[i] = lane_grads_[i].view(specs[i].rows, specs[i].width);
    }
  }

  // Which units activation checkpointing recomputes (Options).
  std::vector<char> recomputed(const std::vector<std::int64_t>& saved) const {
    return detail::recomputed_units(saved, sizeof(T), options_.recompute);
  }

  template <class OnLoss>
  void run(const Batch& batch, std::int64_t step, int k, std::vector<float>* outputs, OnLoss&& on_loss, bool backward) {
    constexpr bool sink = detail::is_output_sink<std::remove_cvref_t<OnLoss>>;
    constexpr bool has_loss = !std::is_null_pointer_v<std::remove_cvref_t<OnLoss>> && !sink;
    auto units = model_.units();
    const SeqShape shape = check_batch(batch);
    const HostTensor& x = batch.at("x");
    const bool input_unit = first_is_input_unit();
    if (!input_unit && !is_floating(x.type))
      throw config_error("the batch's x holds " + std::string(element_name(x.type)) + " ids " + shape_text(x.shape) +
                             " but the model's first unit reads float features",
                         "start the model with an input unit (nn::Embedding) to read token ids, or give x as float "
                         "features [B, F]");
    // Every unit's width follows from the input width alone: worked out once.
    const std::int64_t in_width = input_unit ? 0 : x.shape.back();
    if (width_.empty() || width_[0] != in_width) {
      width_.assign(1, in_width);
      detail::for_each_unit(units, [&](std::size_t, auto& u) { width_.push_back(u.out_features(width_.back())); });
      activations_.resize(num_units_ + 1);
      saved_.resize(num_units_ + 1);
    }
    const auto& width = width_;
    // The rows follow from the micro-batch's shape (units may change them: out_shape).
    std::vector<SeqShape> seq{shape};
    detail::for_each_unit(units, [&](std::size_t, auto& u) { seq.push_back(out_shape_of(u, seq.back(), shape)); });
    std::int64_t largest = 0;  // the largest activation: what a gradient buffer holds
    for (std::size_t u = 0; u <= num_units_; ++u) {
      const std::int64_t n = seq[u].rows() * width[u];
      largest = std::max(largest, n);
      if (u > 0 || !input_unit) ensure(activations_[u], static_cast<std::size_t>(n));
    }
    for (auto& d : dgrad_) ensure(d, static_cast<std::size_t>(largest));

    // What units keep from forward for backward: a buffer each, or for the
    // units activation checkpointing recomputes one buffer they take in turn
    // (saved_'s last).
    std::vector<std::int64_t> saved(num_units_);
    detail::for_each_unit(
        units, [&](std::size_t u, auto& unit) { saved[u] = saved_size_of<T>(unit, dev_, seq[u], width[u]); });
    const std::vector<char> recompute = recomputed(saved);
    for (std::size_t u = 0; u < num_units_; ++u)
      if (saved[u] > 0) ensure(recompute[u] ? saved_[num_units_] : saved_[u], static_cast<std::size_t>(saved[u]));
    // A training forward's random stream: seed, rank, step, micro-batch, unit.
    const std::uint64_t micro_stream = detail::derive_stream(
        detail::derive_stream(detail::derive_stream(options_.seed, static_cast<std::uint64_t>(options_.rank)),
                              static_cast<std::uint64_t>(step)),
        static_cast<std::uint64_t>(k));
    const DeviceBatch on_device = upload(batch, input_unit);
    make_lanes(units, seq, width, backward);
    auto ctx = [&](std::size_t u) {
      buffer<T>& b = recompute[u] ? saved_[num_units_] : saved_[u];
      return UnitContext<T>{seq[u],         saved[u] > 0 ? b.view(1, saved[u]) : MatView<T>{},
                            backward,       detail::derive_stream(micro_stream, u),
                            &on_device,     &lanes_,
                            mode_.adapters, mode_.cache_positions > 0 ? &kv_[u] : nullptr};
    };

    auto act = [&](std::size_t u) { return activations_[u].view(seq[u].rows(), width[u]); };
    auto forward = [&](std::size_t u, auto& unit) {
      ties_.before_forward(u);
      detail::unit_forward<Dev, T>(unit, dev_, ties_.params(u), on_device, act(u), act(u + 1), ctx(u));
    };
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) {
      strategy_.before_forward(u, k);
      forward(u, unit);
      strategy_.after_forward(u, k);
      if (u == 0) fault::hit(fault::point::forward);
    });
    const MatView<const T> logits = act(num_units_);
    if (outputs != nullptr) {
      std::vector<T> host(static_cast<std::size_t>(logits.size()));
      dev_.copy_to_host(host.data(), logits.data, host.size());
      outputs->assign(host.size(), 0.f);
      for (std::size_t i = 0; i < host.size(); ++i) (*outputs)[i] = static_cast<float>(host[i]);
    }
    if constexpr (sink) on_loss.f(dev_, logits, on_device);
    if constexpr (has_loss) {  // (predict has none: the output alone)
      const float dlogit_scale = on_loss(model_.loss.template forward<Dev, T>(dev_, logits, on_device));
      if (!backward) return;
      std::size_t cur = 0;
      model_.loss.template backward<Dev, T>(dev_, logits, on_device, dgrad_[cur].view(logits.rows, logits.cols),
                                            dlogit_scale);
      detail::for_each_unit_reverse(units, num_units_, [&](std::size_t u, auto& unit) {
        const MatView<T> dx = u == 0 ? MatView<T>{} : dgrad_[1 - cur].view(seq[u].rows(), width[u]);
        const MatView<const T> dy = dgrad_[cur].view(seq[u + 1].rows(), width[u + 1]);
        strategy_.before_backward(u, k);
        // Below the first unit with trainable parameters (a frozen vision
        // tower under LLaVA's first stage) no gradient is wanted: the units'
        // backward is skipped, the strategy's hooks still run (a DDP bucket
        // may end at such a unit).
        if (u >= first_trained_) {
          // Deterministic kernels: the recomputed activations (and output)
          // are bit-identical to the first forward's.
          if (recompute[u] && saved[u] > 0) forward(u, unit);
          detail::unit_backward<Dev, T>(unit, dev_, ties_.params(u), ties_.grads(u), on_device, act(u), act(u + 1), dy,
                                        dx, ctx(u));
        }
        ties_.after_backward(u);
        strategy_.after_backward(u, k);
        if (u + 1 == num_units_) fault::hit(fault::point::backward);
        cur = 1 - cur;
      });
    }
  }

  M& model_;
  Dev& dev_;
  AnyStrategy<T>& strategy_;
  TiedParams<Dev, T> ties_;
  std::size_t num_units_;
  std::size_t first_trained_;  // the lowest unit with trainable parameters (num_units_: none)
  DecodeOptions mode_{};       // forward_output's, during it
  std::vector<KvSlot<T>> kv_;  // per unit: the key-value caches of cached forwards
  Options options_;
  std::vector<std::int64_t> width_;  // width_[u]: the input width of unit u; width_.back(): the output's
  std::vector<buffer<T>> activations_;
  std::vector<buffer<T>> saved_;  // per unit, and last the one recomputed units share
  buffer<T> dgrad_[2];
  std::vector<buffer<T>> lane_values_, lane_grads_;                // by lane id
  Lanes<T> lanes_;                                                 // views of them for the units
  std::map<std::string, buffer<std::byte>, std::less<>> uploads_;  // the batch's tensors on the device
  std::vector<T> staging_;
};

}  // namespace dtrain
