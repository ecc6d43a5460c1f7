#pragma once
// nn::GrpoLoss: the policy loss of group relative policy optimisation
// (GRPO) as TRL's GRPOTrainer computes it, over a causal language model's
// logits; a dtrain::Loss, so every strategy, precision, accumulation and
// LoRA trains with it as with SoftmaxCrossEntropy.
//
// A micro-batch holds B sequences of T tokens, each a prompt and one of its
// sampled completions; targets "y" [B, T] are the next token ids on the
// completion and ignore_index elsewhere. Per completion token t of
// sequence s, with logp_t the policy's log-probability of its target:
//   ratio_t = exp(logp_t - old_t)       old: batch "old_logps" [B, T] (the
//             sampling policy's), or without it logp_t itself, detached
//             (ratio 1: one update per generation, TRL's default)
//   l_t     = -min(ratio_t A_s, clip(ratio_t, 1 - eps, 1 + eps_high) A_s)
//             + beta ratio_t (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)
//             (the ratio factor: TRL's use_bias_correction_kl, its default;
//             bias_correction_kl = false leaves it out)
// A_s: batch "advantages" [B] (group-normalised rewards); ref: batch
// "ref_logps" [B, T] (the reference's per-token log-probabilities), read
// only when beta != 0. The loss is TRL's default loss_type "dapo": the sum
// of l_t over every completion token of the step, on every rank and
// micro-batch, divided by their number (count(): the micro-batch's
// completion tokens).
//   backward: dlogits_r = (softmax(z_r) - onehot(y_r)) * (-dl_r/dlogp_r) * scale
//
// Its figures (take_metric_sums(), in TRL's names): kl (beta != 0),
// clip_ratio/low_mean, clip_ratio/high_mean, clip_ratio/region_mean (token
// means), and with batch "rewards" [B] (the completions' rewards, for the
// figures only) reward, reward_std and completions/mean_length (means over
// sequences; reward also on fit's log line, as "reward mean").
//
// On a GPU it runs only with DTRAIN_GPU_PREFERENCE=on (its kernels are the
// preference loss's).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/preference_loss.hpp"
#include "dtrain/nn/sequence_logps.hpp"

namespace dtrain::nn {

struct GrpoLossOptions {
  float epsilon = 0.2f;      // TRL's epsilon: the ratio's lower clip 1 - epsilon
  float epsilon_high = 0.f;  // its upper clip 1 + epsilon_high; 0: epsilon (TRL's default)
  float beta = 0.f;          // the KL term's weight (TRL's default 0: no reference needed)
  // TRL's use_bias_correction_kl (default true): the KL term times the
  // ratio, whose derivative then counts even on-policy (ratio 1)
  bool bias_correction_kl = true;
  std::int64_t ignore_index = -100;
  std::string target = "y";
};

class GrpoLoss {
 public:
  GrpoLoss() = default;
  explicit GrpoLoss(GrpoLossOptions o) : o_(std::move(o)) {
    if (!(o_.epsilon > 0.f && o_.epsilon < 1.f) || !(o_.epsilon_high >= 0.f) || !(o_.beta >= 0.f) ||
        !std::isfinite(o_.beta))
      throw config_error("nn::GrpoLoss: epsilon " + std::to_string(o_.epsilon) + ", epsilon_high " +
                             std::to_string(o_.epsilon_high) + ", beta " + std::to_string(o_.beta),
                         "give epsilon in (0, 1) (TRL's 0.2), epsilon_high >= 0 (0: epsilon) and beta >= 0");
  }

  const GrpoLossOptions& options() const { return o_; }

  // The completion tokens of a micro-batch.
  double count(const Batch& batch) const {
    const HostTensor& t = batch.at(o_.target);
    double n = 0;
    if (t.type == element_type::i32)
      for (const auto l : t.values<std::int32_t>()) n += l == o_.ignore_index ? 0 : 1;
    else
      for (const auto l : t.values<std::int64_t>()) n += l == o_.ignore_index ? 0 : 1;
    return n;
  }

  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch) {
    const Tokens k = tokens(dev, logits, batch);
    double total = 0;
    for (std::size_t r = 0; r < k.logp.size(); ++r) {
      if (!k.scored[r]) continue;
      const Token g = token(k, r);
      total += g.loss;
      sums_.tokens += 1;
      sums_.kl += g.kl;
      sums_.low += g.low;
      sums_.high += g.high;
    }
    if (const DeviceTensor* rw = batch.find("rewards")) {
      const std::vector<double> r = per_sequence(*rw, k.seqs, "rewards");
      for (std::int64_t s = 0; s < k.seqs; ++s) {
        sums_.sequences += 1;
        sums_.reward += r[static_cast<std::size_t>(s)];
        sums_.reward_sq += r[static_cast<std::size_t>(s)] * r[static_cast<std::size_t>(s)];
        sums_.length += k.length[static_cast<std::size_t>(s)];
      }
    }
    return total;
  }

  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch, MatView<T> dlogits, float scale) {
    detail::check_shape("nn::GrpoLoss", "logits gradient", dlogits, logits.rows, logits.cols);
    const Tokens k = tokens(dev, logits, batch);
    std::vector<float> w(static_cast<std::size_t>(logits.rows), 0.f);
    for (std::size_t r = 0; r < w.size(); ++r)
      if (k.scored[r]) w[r] = static_cast<float>(-token(k, r).dlogp * static_cast<double>(scale));
    detail::weighted_cross_entropy_backward(dev, logits, batch.at(o_.target), o_.ignore_index, w, dlogits,
                                            "nn::GrpoLoss");
  }

  // TRL's figures over what forward saw since the last call.
  LossMetricSums take_metric_sums() {
    const Sums s = std::exchange(sums_, Sums{});
    LossMetricSums m{s.tokens, {}};
    if (o_.beta != 0.f) m.sums.push_back({"kl", s.kl, false});
    m.sums.push_back({"clip_ratio/low_mean", s.low, false});
    m.sums.push_back({"clip_ratio/high_mean", s.high, false});
    m.sums.push_back({"clip_ratio/region_mean", s.low + s.high, false});
    m.sums.push_back({.name = "reward", .sum = s.reward, .logged = true, .count = s.sequences, .label = "reward mean"});
    m.sums.push_back({.name = "reward_std", .sum = s.reward, .count = s.sequences, .square_sum = s.reward_sq});
    m.sums.push_back({.name = "completions/mean_length", .sum = s.length, .count = s.sequences});
    return m;
  }

 private:
  // Per row of a micro-batch, on the host.
  struct Tokens {
    std::int64_t seqs = 0, time = 0;
    std::vector<double> logp, old, ref, adv;  // per row (adv per sequence)
    std::vector<char> scored;                 // the row's target is a completion token
    std::vector<double> length;               // per sequence: completion tokens
  };
  struct Token {
    double loss = 0, dlogp = 0, kl = 0, low = 0, high = 0;
  };
  struct Sums {
    double tokens = 0, kl = 0, low = 0, high = 0, sequences = 0, reward = 0, reward_sq = 0, length = 0;
  };

  template <class Dev, class T>
  Tokens tokens(Dev& dev, MatView<const T> logits, const DeviceBatch& batch) const {
    if constexpr (!Dev::host_accessible) detail::require_gpu_switch("nn::GrpoLoss", "DTRAIN_GPU_PREFERENCE");
    const DeviceTensor& y = batch.at(o_.target);
    if (y.shape.size() != 2)
      throw config_error("nn::GrpoLoss: targets '" + o_.target + "' are " + shape_text(y.shape) + ", not [B, T]",
                         "give one row of next-token ids per sequence");
    SequenceLogps l = sequence_logps(dev, logits, y, o_.ignore_index, "nn::GrpoLoss");
    Tokens k;
    k.seqs = y.shape[0];
    k.time = y.shape[1];
    k.logp = std::move(l.row_logp);
    k.length = std::move(l.tokens);
    k.scored.assign(k.logp.size(), 0);
    detail::with_label_type(y, "nn::GrpoLoss", [&]<class Label>() {
      const Label* labels = y.host_data<Label>();
      for (std::size_t r = 0; r < k.scored.size(); ++r) k.scored[r] = labels[r] != o_.ignore_index;
    });
    const DeviceTensor* adv = batch.find("advantages");
    if (adv == nullptr)
      throw config_error("nn::GrpoLoss: the batch has no 'advantages' (each completion's group-normalised reward, [B])",
                         "score the completions and normalise their rewards within each prompt's group before the "
                         "step (train_lm objective=grpo does)");
    k.adv = per_sequence(*adv, k.seqs, "advantages");
    k.old = per_row(batch.find("old_logps"), k, "old_logps");
    if (k.old.empty()) k.old = k.logp;  // one update per generation: the ratio is 1
    if (o_.beta != 0.f) {
      const DeviceTensor* ref = batch.find("ref_logps");
      if (ref == nullptr)
        throw config_error("nn::GrpoLoss: beta " + std::to_string(o_.beta) +
                               " needs the reference's per-token log-probabilities, batch tensor 'ref_logps' [B, T]",
                           "compute them with the reference model before the step, or set beta to 0");
      k.ref = per_row(ref, k, "ref_logps");
    }
    return k;
  }

  // Token r's loss, its derivative by logp_r, and its figures.
  Token token(const Tokens& k, std::size_t r) const {
    const double a = k.adv[r / static_cast<std::size_t>(k.time)], lp = k.logp[r];
    const double ratio = std::exp(lp - k.old[r]);
    const double lo = 1.0 - o_.epsilon, hi = 1.0 + (o_.epsilon_high > 0.f ? o_.epsilon_high : o_.epsilon);
    const double clipped = ratio < lo ? lo : ratio > hi ? hi : ratio;
    Token g;
    // -min(ratio a, clipped a): the clipped term wins (and passes no gradient
    // when its clip is active) only where it is strictly smaller
    if (clipped * a < ratio * a) {
      g.loss = -clipped * a;
      g.dlogp = clipped == ratio ? -a * ratio : 0.0;
    } else {
      g.loss = -ratio * a;
      g.dlogp = -a * ratio;
    }
    g.low = ratio < lo && a < 0 ? 1.0 : 0.0;
    g.high = ratio > hi && a > 0 ? 1.0 : 0.0;
    if (o_.beta != 0.f) {
      const double d = k.ref[r] - lp, kl = std::exp(d) - d - 1.0, dkl = 1.0 - std::exp(d);
      if (o_.bias_correction_kl) {  // ratio * kl: d/dlogp = ratio (kl + dkl), the ratio's own derivative included
        g.kl = ratio * kl;
        g.dlogp += o_.beta * ratio * (kl + dkl);
      } else {
        g.kl = kl;
        g.dlogp += o_.beta * dkl;
      }
      g.loss += o_.beta * g.kl;
    }
    return g;
  }

  // (a non-finite advantage or reward passes: the loss is then non-finite
  // and the trainer's non-finite policy acts, as for a diverged step)
  static std::vector<double> per_sequence(const DeviceTensor& t, std::int64_t seqs, const char* what) {
    if (t.numel() != seqs || (t.type != element_type::f32 && t.type != element_type::f64))
      throw config_error(std::string("nn::GrpoLoss: '") + what + "' is " + shape_text(t.shape) + " " +
                             std::string(element_name(t.type)) + " for " + std::to_string(seqs) + " sequences",
                         "give one float per sequence, [B]");
    return values(t, false);
  }
  static std::vector<double> per_row(const DeviceTensor* t, const Tokens& k, const char* what) {
    if (t == nullptr) return {};
    if (t->numel() != k.seqs * k.time || (t->type != element_type::f32 && t->type != element_type::f64))
      throw config_error(std::string("nn::GrpoLoss: '") + what + "' is " + shape_text(t->shape) + " " +
                             std::string(element_name(t->type)) + " for targets [" + std::to_string(k.seqs) + ", " +
                             std::to_string(k.time) + "]",
                         "give one float per token, [B, T] like the targets");
    return values(*t, true);
  }
  static std::vector<double> values(const DeviceTensor& t, bool finite) {
    std::vector<double> v(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = t.type == element_type::f64 ? t.host_data<double>()[i] : static_cast<double>(t.host_data<float>()[i]);
    for (std::size_t i = 0; i < v.size() && finite; ++i)
      if (!std::isfinite(v[i]))
        throw config_error("nn::GrpoLoss: a log-probability of the batch (element " + std::to_string(i) + ") is " +
                               std::to_string(v[i]),
                           "check the model the old or reference log-probabilities came from");
    return v;
  }

  GrpoLossOptions o_{};
  Sums sums_{};
};

}  // namespace dtrain::nn
