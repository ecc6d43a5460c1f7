// What the Trainer's DDP machinery costs when there is nobody to talk to:
// the Trainer at world size 1 against a hand-written loop with no
// communication at all, built from the same public pieces (the same units,
// the same Host device, ModelLayout for the flat parameters, AdamWStep over
// the flat buffer). The model is train_mlp's benchmark model: 32 features,
// Linear-GELU-Linear-GELU-Linear with hidden [256, 256], 10 classes,
// batch 64, AdamW.
//
// The two loops run alternately in rounds on the same batches, so load from
// other jobs hits both alike; each reports the median step time after
// warm-up. Both do the same arithmetic, so their parameters must agree to
// the bit at the end: the bench checks that, and a difference fails it.
//
//   bench_ddp_overhead [--rounds R] [--steps S] [--warmup W] [--json PATH]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <dtrain/trainer.hpp>

namespace {

using namespace dtrain;
using clock_type = std::chrono::steady_clock;

constexpr std::int64_t features = 32, hidden = 256, classes = 10, batch_rows = 64;
constexpr std::uint64_t seed = 0;
constexpr const char* usage = "usage: bench_ddp_overhead [--rounds R] [--steps S] [--warmup W] [--json PATH]";

struct Options {
  int rounds = 6;
  int steps = 100;  // timed steps per loop per round
  int warmup = 20;  // untimed steps per loop before the first round
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) throw config_error(std::string("missing value after ") + argv[i], usage);
    const std::string value = argv[++i];
    if (arg == "--rounds")
      o.rounds = std::max(1, std::stoi(value));
    else if (arg == "--steps")
      o.steps = std::max(1, std::stoi(value));
    else if (arg == "--warmup")
      o.warmup = std::max(0, std::stoi(value));
    else if (arg == "--json")
      o.json = value;
    else
      throw config_error("unknown option " + std::string(arg), usage);
  }
  return o;
}

struct Mlp {
  nn::Linear l1{features, hidden};
  nn::GELU a1;
  nn::Linear l2{hidden, hidden};
  nn::GELU a2;
  nn::Linear l3{hidden, classes};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, a1, l2, a2, l3); }
};

template <class Tuple, class F>
void visit_units(Tuple&& units, F&& f) {
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Tuple>>;
  [&]<std::size_t... I>(std::index_sequence<I...>) { (f(I, std::get<I>(units)), ...); }
  (std::make_index_sequence<n>{});
}

template <class Tuple, class F>
void visit_units_reverse(Tuple&& units, F&& f) {
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Tuple>>;
  [&]<std::size_t... I>(std::index_sequence<I...>) { (f(n - 1 - I, std::get<n - 1 - I>(units)), ...); }
  (std::make_index_sequence<n>{});
}

// One process, no communicator: forward, loss, backward into a flat fp32
// gradient, one AdamW pass over the flat parameters. Parameters start from
// the values the Trainer gives them (same seed, same layout).
class HandLoop {
 public:
  HandLoop(Mlp& model, const AdamWHyper& hyper) : model_(model), hyper_(hyper), layout_(declared(model)) {
    const std::size_t n = layout_.trainable_numel();
    params_ = make_buffer<float>(dev_, n);
    grads_ = make_buffer<float>(dev_, n);
    exp_avg_ = make_buffer<float>(dev_, n, zero_init);
    exp_avg_sq_ = make_buffer<float>(dev_, n, zero_init);
    for (const auto& unit : layout_.units()) {
      auto& p = params_views_.emplace_back();
      auto& g = grad_views_.emplace_back();
      for (const auto& slot : unit.params) {
        const auto numel = static_cast<std::size_t>(slot.spec.numel());
        init_values(params_.span().subspan(slot.offset, numel), slot.spec.init,
                    param_seed(seed, slot.unit, slot.index));
        const std::int64_t rows = slot.spec.shape[0];
        p.push_back({params_.data() + slot.offset, rows, slot.spec.numel() / rows});
        g.push_back({grads_.data() + slot.offset, rows, slot.spec.numel() / rows});
      }
    }
    std::vector<std::int64_t> width{features};
    visit_units(model_.units(), [&](std::size_t, auto& u) { width.push_back(u.out_features(width.back())); });
    for (const std::int64_t w : width) activations_.push_back(make_buffer<float>(dev_, batch_rows * w));
    widths_ = width;
    const std::int64_t widest = *std::max_element(width.begin(), width.end());
    for (auto& d : dgrad_) d = make_buffer<float>(dev_, batch_rows * widest);
    labels_ = make_buffer<std::int32_t>(dev_, batch_rows);
  }

  double step(const Batch& b) {
    const auto x = b.at("x").values<float>();
    const HostTensor& y = b.at("y");
    dev_.copy_from_host(activations_[0].data(), x.data(), x.size());
    dev_.copy_from_host(labels_.data(), y.values<std::int32_t>().data(), static_cast<std::size_t>(batch_rows));
    DeviceBatch on_device;
    on_device.set(
        "y", DeviceTensor{y.type, y.shape, reinterpret_cast<const std::byte*>(labels_.data()), y.bytes.data(), {}});
    auto units = model_.units();
    auto act = [&](std::size_t u) { return activations_[u].view(batch_rows, widths_[u]); };
    visit_units(units, [&](std::size_t u, auto& unit) {
      unit.template forward<Host, float>(dev_, cparams(u), act(u), act(u + 1));
    });
    const std::size_t last = widths_.size() - 1;
    const MatView<const float> logits = act(last);
    const double loss = model_.loss.template forward<Host, float>(dev_, logits, on_device);
    std::size_t cur = 0;
    model_.loss.template backward<Host, float>(dev_, logits, on_device, dgrad_[cur].view(batch_rows, widths_[last]),
                                               1.f / static_cast<float>(batch_rows));
    visit_units_reverse(units, [&](std::size_t u, auto& unit) {
      const MatView<float> dx = u == 0 ? MatView<float>{} : dgrad_[1 - cur].view(batch_rows, widths_[u]);
      unit.template backward<Host, float>(dev_, cparams(u), UnitParams<float>(grad_views_[u]), act(u), act(u + 1),
                                          dgrad_[cur].view(batch_rows, widths_[u + 1]), dx);
      cur = 1 - cur;
    });
    ++step_;
    dev_.for_each(params_.size(), AdamWStep<float>({params_.data(), grads_.data(), exp_avg_.data(), exp_avg_sq_.data()},
                                                   hyper_, step_));
    return loss / batch_rows;
  }

  const ModelLayout& layout() const { return layout_; }
  const float* params() const { return params_.data(); }

 private:
  static std::vector<std::vector<ParamSpec>> declared(Mlp& model) {
    std::vector<std::vector<ParamSpec>> all;
    visit_units(model.units(), [&](std::size_t, auto& u) { all.push_back(u.params()); });
    return all;
  }

  UnitParams<const float> cparams(std::size_t u) {
    const_views_.assign(params_views_[u].begin(), params_views_[u].end());
    return const_views_;
  }

  Mlp& model_;
  AdamWHyper hyper_;
  ModelLayout layout_;
  Host dev_;
  Host::buffer<float> params_, grads_, exp_avg_, exp_avg_sq_;
  std::vector<std::vector<MatView<float>>> params_views_, grad_views_;
  std::vector<MatView<const float>> const_views_;
  std::vector<Host::buffer<float>> activations_;
  std::vector<std::int64_t> widths_;
  Host::buffer<float> dgrad_[2];
  Host::buffer<std::int32_t> labels_;
  std::int64_t step_ = 0;
};

std::vector<Batch> random_batches(std::size_t count) {
  std::vector<Batch> out(count);
  SplitMix64 rng(0xba7c4);
  for (std::size_t k = 0; k < count; ++k) {
    std::vector<float> x(static_cast<std::size_t>(batch_rows * features));
    init_values(x, Init::normal(0.f, 1.f), 100 + k);
    std::vector<std::int32_t> y;
    for (std::int64_t r = 0; r < batch_rows; ++r) y.push_back(static_cast<std::int32_t>(rng.next() % classes));
    out[k] = Batch::table(x, y, batch_rows, features);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    World world = init();
    if (world.size() != 1)
      throw config_error(
          "bench_ddp_overhead measures world size 1 but was launched with " + std::to_string(world.size()) + " ranks",
          "run it directly, without a launcher");
    const auto batches = random_batches(16);
    const AdamW adamw{.lr = 1e-3f, .weight_decay = 1e-2f};
    const AdamWHyper hyper{adamw.lr, adamw.beta1, adamw.beta2, adamw.eps, adamw.weight_decay};

    Mlp trainer_model, lean_model, hand_model;
    Trainer<Mlp, Device<Host>> trainer(world, trainer_model, adamw, {.seed = seed});
    // The same without the per-step gradient norm (TrainerOptions::grad_norm).
    Trainer<Mlp, Device<Host>> lean(world, lean_model, adamw, {.seed = seed, .grad_norm = false});
    HandLoop hand(hand_model, hyper);

    std::size_t trainer_next = 0, hand_next = 0, lean_next = 0;
    std::vector<double> trainer_ms, hand_ms, lean_ms;
    double max_loss_diff = 0;
    std::vector<double> trainer_losses;
    auto run_trainer = [&](int steps, bool timed) {
      for (int s = 0; s < steps; ++s) {
        const Batch& b = batches[trainer_next++ % batches.size()];
        const auto t0 = clock_type::now();
        const StepStats st = trainer.step(std::span(&b, 1));
        if (timed) trainer_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        trainer_losses.push_back(st.loss);
      }
    };
    auto run_lean = [&](int steps, bool timed) {
      for (int s = 0; s < steps; ++s) {
        const Batch& b = batches[lean_next++ % batches.size()];
        const auto t0 = clock_type::now();
        lean.step(std::span(&b, 1));
        if (timed) lean_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
      }
    };
    auto run_hand = [&](int steps, bool timed) {
      for (int s = 0; s < steps; ++s) {
        const Batch& b = batches[hand_next % batches.size()];
        const auto t0 = clock_type::now();
        const double loss = hand.step(b);
        if (timed) hand_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        // The Trainer reports its loss through a float all-reduce.
        max_loss_diff = std::max(max_loss_diff, std::abs(static_cast<float>(loss) - trainer_losses[hand_next]));
        ++hand_next;
      }
    };
    run_trainer(opt.warmup, false);
    run_lean(opt.warmup, false);
    run_hand(opt.warmup, false);
    for (int r = 0; r < opt.rounds; ++r) {
      run_trainer(opt.steps, true);
      run_lean(opt.steps, true);
      run_hand(opt.steps, true);
    }

    const auto trained = trainer.parameters();
    double max_param_diff = 0;
    for (const auto& unit : hand.layout().units())
      for (const auto& slot : unit.params) {
        const auto& mine = trained.at(slot.name);
        for (std::size_t i = 0; i < mine.size(); ++i)
          max_param_diff =
              std::max(max_param_diff, static_cast<double>(std::abs(mine[i] - hand.params()[slot.offset + i])));
      }

    const double t_ms = median(trainer_ms), h_ms = median(hand_ms), l_ms = median(lean_ms);
    const double overhead = (t_ms / h_ms - 1.0) * 100.0;
    const double lean_overhead = (l_ms / h_ms - 1.0) * 100.0;
    const int threads = trainer.device().threads();
    std::printf(
        "\nDDP overhead at world size 1 (Host, fp32, %d thread(s), batch %lld, hidden [%lld, %lld], "
        "median of %zu steps each)\n",
        threads, static_cast<long long>(batch_rows), static_cast<long long>(hidden), static_cast<long long>(hidden),
        trainer_ms.size());
    std::printf("%-34s%12s%14s\n", "loop", "step ms", "samples/s");
    std::printf("%-34s%12.3f%14.0f\n", "Trainer<DDP>, world size 1", t_ms, batch_rows / t_ms * 1e3);
    std::printf("%-34s%12.3f%14.0f\n", "Trainer<DDP>, grad_norm = false", l_ms, batch_rows / l_ms * 1e3);
    std::printf("%-34s%12.3f%14.0f\n", "hand-written, no communication", h_ms, batch_rows / h_ms * 1e3);
    std::printf(
        "overhead: %+.1f%% (grad_norm = false: %+.1f%%)   (same results: max |param diff| %.3g, max |loss "
        "diff| %.3g)\n",
        overhead, lean_overhead, max_param_diff, max_loss_diff);

    char json[1024];
    std::snprintf(json, sizeof json,
                  "{\"threads\": %d, \"batch\": %lld, \"hidden\": [%lld, %lld], \"steps_timed\": %zu, "
                  "\"trainer_step_ms\": %.4f, \"hand_step_ms\": %.4f, \"overhead_pct\": %.2f, "
                  "\"trainer_no_grad_norm_step_ms\": %.4f, \"overhead_no_grad_norm_pct\": %.2f, "
                  "\"max_param_diff\": %.3g, \"max_loss_diff\": %.3g}\n",
                  threads, static_cast<long long>(batch_rows), static_cast<long long>(hidden),
                  static_cast<long long>(hidden), trainer_ms.size(), t_ms, h_ms, overhead, l_ms, lean_overhead,
                  max_param_diff, max_loss_diff);
    if (!opt.json.empty()) std::ofstream(opt.json) << json;
    if (max_param_diff != 0.0) {
      std::fprintf(stderr, "bench_ddp_overhead: the two loops disagree, so the comparison is not like for like\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp_overhead: %s\n", e.what());
    return 1;
  }
}
