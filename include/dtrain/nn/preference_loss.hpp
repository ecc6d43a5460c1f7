#pragma once
// nn::PreferenceLoss: direct preference optimisation (DPO) and the variants
// TRL's DPOTrainer names by loss_type, over a causal language model's
// logits; a dtrain::Loss, so every strategy, precision, accumulation and
// LoRA trains with it as with SoftmaxCrossEntropy.
//
// A micro-batch holds 2P sequences of T tokens, the P chosen completions
// first and then the P rejected ones in the same order (pair i is sequences
// i and P + i, TRL's layout). Targets (batch tensor "y", [2P, T], int32 or
// int64) are the next token ids on the completion and ignore_index
// elsewhere (prompt, padding). Batch tensor "ref_logps" ([2P], f32 or f64)
// is the reference model's log-probability of each sequence's completion
// (summed over its tokens): a frozen copy's, the policy's own with its
// adapters switched off, or precomputed; the loss never runs a reference.
//   logp_s  = sum over the completion rows r of s of log softmax(z_r)[y_r]
//   score_s = logp_s - ref_s;  delta = score_chosen - score_rejected
//   sigmoid  -log sigmoid(beta delta)                     (DPO)
//   hinge    max(0, 1 - beta delta)                       (SLiC)
//   ipo      (score_c / n_c - score_r / n_r - 1 / (2 beta))^2, n the
//            completion's tokens (TRL's length-normalised IPO)
//   robust   (-(1 - e) log sigmoid(beta delta) + e log sigmoid(-beta delta))
//            / (1 - 2 e), e = label_smoothing in [0, 0.5) (TRL's label
//            smoothing; its sigmoid takes none, so dtrain refuses one there)
// count: P, so a step's loss is the mean over its pairs, on every rank and
// micro-batch, as TRL's; forward: the sum of the pair losses (double);
// backward: dlogits_r = (softmax(z_r) - onehot(y_r)) * (-dL/dlogp_s) * scale.
// sums() gives TRL's metrics (rewards/chosen, rewards/rejected,
// rewards/accuracies, rewards/margins, logps/chosen, logps/rejected) summed
// over the pairs forward has seen since the last take_sums().
//
// The sequence log-probabilities are summed in double on the host from the
// per-row cross-entropies (2P numbers per micro-batch); backward recomputes
// them rather than keep state between the calls.
//
// On a GPU the loss runs only with DTRAIN_GPU_PREFERENCE=on: its kernels
// compile in CI but no GPU run has checked them yet (docs/gpu.md).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/sequence_logps.hpp"

namespace dtrain::nn {

enum class PreferenceLossType { sigmoid, hinge, ipo, robust };

inline const char* preference_loss_name(PreferenceLossType t) {
  switch (t) {
    case PreferenceLossType::sigmoid: return "sigmoid";
    case PreferenceLossType::hinge: return "hinge";
    case PreferenceLossType::ipo: return "ipo";
    case PreferenceLossType::robust: return "robust";
  }
  return "?";
}

// TRL's loss_type name; anything else is a config_error listing the names.
inline PreferenceLossType preference_loss_named(std::string_view name) {
  for (const auto t :
       {PreferenceLossType::sigmoid, PreferenceLossType::hinge, PreferenceLossType::ipo, PreferenceLossType::robust})
    if (name == preference_loss_name(t)) return t;
  throw config_error("loss_type '" + std::string(name) + "' is not a preference loss dtrain has",
                     "give one of sigmoid (DPO), hinge, ipo, robust (label smoothing), as TRL names them");
}

struct PreferenceLossOptions {
  PreferenceLossType type = PreferenceLossType::sigmoid;
  float beta = 0.1f;            // TRL's default
  float label_smoothing = 0.f;  // robust only: the probability a preference label is flipped
  std::int64_t ignore_index = -100;
  std::string target = "y";
  std::string reference = "ref_logps";
};

// TRL's metrics, summed over pairs (divide by `pairs` for its means).
struct PreferenceSums {
  double pairs = 0;
  double rewards_chosen = 0;    // beta * (logp_c - ref_c)
  double rewards_rejected = 0;  // beta * (logp_r - ref_r)
  double accuracies = 0;        // rewards_chosen > rewards_rejected
  double margins = 0;           // rewards_chosen - rewards_rejected
  double logps_chosen = 0;
  double logps_rejected = 0;

  PreferenceSums& operator+=(const PreferenceSums& o) {
    pairs += o.pairs;
    rewards_chosen += o.rewards_chosen;
    rewards_rejected += o.rewards_rejected;
    accuracies += o.accuracies;
    margins += o.margins;
    logps_chosen += o.logps_chosen;
    logps_rejected += o.logps_rejected;
    return *this;
  }
};

namespace detail {

// dlogits_r = (softmax(z_r) - onehot(y_r)) * weight[r], 0 where y_r is ignored.
template <class T, class Label>
struct WeightedCrossEntropyRowGrad {
  static constexpr unsigned row_lanes = math::lanes;
  MatView<const T> logits;
  const Label* labels;
  Label ignore;
  const float* weight;
  MatView<T> dlogits;
  std::size_t work_per_index() const { return static_cast<std::size_t>(logits.cols); }
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i);
    cross_entropy_grad_row(logits, r, labels[r], ignore, weight[r], dlogits, lanes);
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

// The sequence losses' backward (PreferenceLoss, GrpoLoss): each row's
// cross-entropy gradient times its weight, the weights (one a row, 0 where
// a row carries no loss) computed on the host from the sequences' log-prob
// gradients. `who` names the loss in a label-type error.
template <class Dev, class T>
void weighted_cross_entropy_backward(Dev& dev, MatView<const T> logits, const DeviceTensor& y,
                                     std::int64_t ignore_index, const std::vector<float>& weight, MatView<T> dlogits,
                                     const char* who) {
  float* wd = dev.template workspace<float>(weight.size());
  dev.copy_from_host(wd, weight.data(), weight.size());
  with_label_type(y, who, [&]<class Label>() {
    dev.for_each(
        static_cast<std::size_t>(logits.rows),
        WeightedCrossEntropyRowGrad<T, Label>{logits, y.data<Label>(), static_cast<Label>(ignore_index), wd, dlogits});
  });
}

// log sigmoid(x), without overflow either way.
inline double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
inline double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

}  // namespace detail

class PreferenceLoss {
 public:
  PreferenceLoss() = default;
  explicit PreferenceLoss(PreferenceLossOptions o) : o_(std::move(o)) { validate(); }

  const PreferenceLossOptions& options() const { return o_; }

  // The pairs in a micro-batch.
  double count(const Batch& batch) const {
    const HostTensor& t = batch.at(o_.target);
    return static_cast<double>(sequences(t.shape) / 2);
  }

  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch) {
    const Pairs p = pairs(dev, logits, batch);
    double total = 0;
    for (std::int64_t i = 0; i < p.n; ++i) {
      total += pair(p, i).loss;
      const double rc = o_.beta * p.score(i), rr = o_.beta * p.score(p.n + i);
      sums_.pairs += 1;
      sums_.rewards_chosen += rc;
      sums_.rewards_rejected += rr;
      sums_.accuracies += rc > rr ? 1.0 : 0.0;
      sums_.margins += rc - rr;
      sums_.logps_chosen += p.logp[static_cast<std::size_t>(i)];
      sums_.logps_rejected += p.logp[static_cast<std::size_t>(p.n + i)];
    }
    return total;
  }

  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch, MatView<T> dlogits, float scale) {
    detail::check_shape("nn::PreferenceLoss", "logits gradient", dlogits, logits.rows, logits.cols);
    const Pairs p = pairs(dev, logits, batch);
    // d loss / d logp_s per sequence, then per row: the CE gradient's sign
    // is (softmax - onehot) = -d logp / d z, hence the minus
    std::vector<float> w(static_cast<std::size_t>(logits.rows), 0.f);
    for (std::int64_t i = 0; i < p.n; ++i) {
      const Grad g = pair(p, i);
      for (const auto& [s, d] : {std::pair{i, g.chosen}, std::pair{p.n + i, g.rejected}})
        for (std::int64_t t = 0; t < p.time; ++t)
          w[static_cast<std::size_t>(s * p.time + t)] = static_cast<float>(-d * static_cast<double>(scale));
    }
    detail::weighted_cross_entropy_backward(dev, logits, batch.at(o_.target), o_.ignore_index, w, dlogits,
                                            "nn::PreferenceLoss");
  }

  // TRL's metrics over the pairs forward saw since the last call (a
  // step's, or an evaluation's), and a fresh start.
  PreferenceSums take_sums() { return std::exchange(sums_, PreferenceSums{}); }
  const PreferenceSums& sums() const { return sums_; }

  // The same as the Trainer reports them (StepStats::metrics, EvalResult::
  // metrics: means over the pairs of every rank), under TRL's names;
  // rewards/margins and rewards/accuracies on fit's progress line.
  LossMetricSums take_metric_sums() {
    const PreferenceSums s = take_sums();
    return {s.pairs,
            {{"rewards/chosen", s.rewards_chosen, false},
             {"rewards/rejected", s.rewards_rejected, false},
             {"rewards/accuracies", s.accuracies, true},
             {"rewards/margins", s.margins, true},
             {"logps/chosen", s.logps_chosen, false},
             {"logps/rejected", s.logps_rejected, false}}};
  }

 private:
  // Per-sequence figures of a micro-batch, on the host.
  struct Pairs {
    std::int64_t n = 0, time = 0;           // pairs, tokens per sequence
    std::vector<double> logp, ref, tokens;  // 2n each: chosen, then rejected
    double score(std::int64_t s) const { return logp[static_cast<std::size_t>(s)] - ref[static_cast<std::size_t>(s)]; }
  };
  struct Grad {
    double loss = 0, chosen = 0, rejected = 0;  // the pair's loss, d loss / d logp of each side
  };

  void validate() const {
    if (!(o_.beta > 0.f) || !std::isfinite(o_.beta))
      throw config_error("nn::PreferenceLoss: beta " + std::to_string(o_.beta) + " is not positive",
                         "give beta > 0 (TRL's default is 0.1)");
    if (o_.type == PreferenceLossType::robust && !(o_.label_smoothing >= 0.f && o_.label_smoothing < 0.5f))
      throw config_error("nn::PreferenceLoss: label_smoothing " + std::to_string(o_.label_smoothing) +
                             " is outside [0, 0.5) for loss_type robust",
                         "give the probability that a preference label is flipped, below 0.5 (0.1 is typical)");
    if (o_.type != PreferenceLossType::robust && o_.label_smoothing != 0.f)
      throw config_error("nn::PreferenceLoss: label_smoothing " + std::to_string(o_.label_smoothing) +
                             " with loss_type " + preference_loss_name(o_.type) + ", which takes none (nor does TRL's)",
                         "use loss_type robust for label smoothing, or set label_smoothing to 0");
  }

  // Sequences in targets shaped [2P, T].
  std::int64_t sequences(const std::vector<std::int64_t>& shape) const {
    if (shape.size() != 2 || shape[0] < 0 || shape[0] % 2 != 0)
      throw config_error("nn::PreferenceLoss: targets '" + o_.target + "' are " + shape_text(shape) +
                             ", not [2P, T] (P chosen sequences, then their P rejected ones)",
                         "give each pair's chosen and rejected sequences in one micro-batch: an even batch size");
    return shape[0];
  }

  template <class Dev, class T>
  Pairs pairs(Dev& dev, MatView<const T> logits, const DeviceBatch& batch) const {
    if constexpr (!Dev::host_accessible) detail::require_gpu_switch("nn::PreferenceLoss", "DTRAIN_GPU_PREFERENCE");
    const DeviceTensor& y = batch.at(o_.target);
    const std::int64_t seqs = sequences(y.shape), time = y.shape[1];
    if (y.numel() != logits.rows || logits.cols < 1)
      throw config_error("nn::PreferenceLoss: " + std::to_string(y.numel()) + " targets " + shape_text(y.shape) +
                             " for " + std::to_string(logits.rows) + " rows of logits",
                         "give one token id per row of the logits: [2P, T] for 2P sequences of T tokens");
    Pairs p;
    p.n = seqs / 2;
    p.time = time;
    p.ref = reference(batch, seqs);
    SequenceLogps l = sequence_logps(dev, logits, y, o_.ignore_index, "nn::PreferenceLoss");
    p.logp = std::move(l.logp);
    p.tokens = std::move(l.tokens);
    for (std::int64_t s = 0; s < seqs; ++s)
      if (p.tokens[static_cast<std::size_t>(s)] == 0)
        throw config_error("nn::PreferenceLoss: the " + std::string(s < p.n ? "chosen" : "rejected") +
                               " sequence of pair " + std::to_string(s % p.n) +
                               " has no completion token (every target is " + std::to_string(o_.ignore_index) + ")",
                           "drop pairs with an empty completion, or shorten the prompt so the completion fits the "
                           "block");
    return p;
  }

  std::vector<double> reference(const DeviceBatch& batch, std::int64_t seqs) const {
    const DeviceTensor* t = batch.find(o_.reference);
    if (t == nullptr)
      throw config_error("nn::PreferenceLoss: the batch has no '" + o_.reference +
                             "' (the reference model's log-probability of each completion)",
                         "compute it with the reference (a frozen copy, or the policy with its adapters off) "
                         "before the step, or give precomputed reference log-probabilities");
    if (t->numel() != seqs)
      throw config_error("nn::PreferenceLoss: '" + o_.reference + "' is " + shape_text(t->shape) + " for " +
                             std::to_string(seqs) + " sequences",
                         "give one reference log-probability per sequence: [2P]");
    std::vector<double> ref(static_cast<std::size_t>(seqs));
    for (std::int64_t s = 0; s < seqs; ++s) {
      const double v =
          t->type == element_type::f64 ? t->host_data<double>()[s] : static_cast<double>(t->host_data<float>()[s]);
      if (!std::isfinite(v))
        throw config_error("nn::PreferenceLoss: the reference log-probability of sequence " + std::to_string(s) +
                               " is " + std::to_string(v),
                           "check the reference model and the sequence's tokens (a completion the reference "
                           "cannot score)");
      ref[static_cast<std::size_t>(s)] = v;
    }
    return ref;
  }

  // Pair i's loss and its derivatives by the two sequences' log-probabilities.
  Grad pair(const Pairs& p, std::int64_t i) const {
    const double beta = o_.beta, sc = p.score(i), sr = p.score(p.n + i);
    Grad g;
    switch (o_.type) {
      case PreferenceLossType::sigmoid:
      case PreferenceLossType::robust:
      case PreferenceLossType::hinge: {
        const double z = beta * (sc - sr);
        double dz = 0;  // d loss / d z
        if (o_.type == PreferenceLossType::sigmoid) {
          g.loss = -detail::log_sigmoid(z);
          dz = -detail::sigmoid(-z);
        } else if (o_.type == PreferenceLossType::robust) {
          const double e = o_.label_smoothing, k = 1.0 / (1.0 - 2.0 * e);
          g.loss = (-(1.0 - e) * detail::log_sigmoid(z) + e * detail::log_sigmoid(-z)) * k;
          dz = -((1.0 - e) * detail::sigmoid(-z) + e * detail::sigmoid(z)) * k;
        } else {
          g.loss = z < 1.0 ? 1.0 - z : 0.0;
          dz = z < 1.0 ? -1.0 : 0.0;
        }
        g.chosen = dz * beta;
        g.rejected = -dz * beta;
        break;
      }
      case PreferenceLossType::ipo: {
        const double nc = p.tokens[static_cast<std::size_t>(i)], nr = p.tokens[static_cast<std::size_t>(p.n + i)];
        const double d = sc / nc - sr / nr - 1.0 / (2.0 * beta);
        g.loss = d * d;
        g.chosen = 2.0 * d / nc;
        g.rejected = -2.0 * d / nr;
        break;
      }
    }
    return g;
  }

  PreferenceLossOptions o_{};
  PreferenceSums sums_{};
};

}  // namespace dtrain::nn
