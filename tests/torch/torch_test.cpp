// LibTorch modules trained by dtrain (dtrain/torch/module.hpp), on the host,
// with train_libtorch's two models (examples/libtorch/models.hpp):
// - each block's gradients, run as dtrain units, equal LibTorch's own
//   backward of the whole module, and a float64 LibTorch run;
// - every built-in strategy at 1, 2 and 3 ranks (threads over Gloo), with
//   accumulation, trains to world-1 DDP's parameters, in fp32 and bf16;
// - the ranks start from rank 0's weights when their modules differ;
// - a checkpoint saved at 2 ranks under FSDP resumes at 3 under ZeRO-1;
// - the state dict round-trips by the module's names;
// - a torch::data dataset feeds dtrain::fit through dtrain's sampler;
// - bad input: blocks that leave parameters out, a parameter in two blocks,
//   a module on another device than the trainer's.
#define BOOST_TEST_MODULE torch
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "libtorch/models.hpp"
#include "strategy/common.hpp"
#include "support/ranks.hpp"
#include "support/strategy_options.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/run/fit.hpp>
#include <dtrain/torch/module.hpp>
#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;
namespace lm = libtorch_models;

namespace {

constexpr std::int64_t vocab = 29, block = 8, dim = 16, heads = 2, layers = 2;
constexpr std::int64_t image = 8, channels = 8, n_classes = 5;

// LibTorch's generator is global: ranks (threads) build their modules one at a time.
std::mutex construct;

lm::Lm make_lm(std::uint64_t seed) {
  std::lock_guard lock(construct);
  torch::manual_seed(seed);
  return lm::Lm(vocab, block, dim, heads, layers);
}
lm::ResNet make_resnet(std::uint64_t seed) {
  std::lock_guard lock(construct);
  torch::manual_seed(seed);
  return lm::ResNet(channels, image, 1, n_classes);
}

// Global rows [first, first + rows) of step `step`'s batch: token windows
// (y the next tokens) or images, random and non-zero.
Batch lm_rows(int step, std::int64_t first, std::int64_t rows) {
  std::vector<std::int32_t> x, y;
  for (std::int64_t r = first; r < first + rows; ++r)
    for (std::int64_t t = 0; t < block; ++t) {
      x.push_back(static_cast<std::int32_t>((step * 131 + r * 17 + t * 7 + (r * t) % 5) % vocab));
      y.push_back(static_cast<std::int32_t>((step * 131 + r * 17 + (t + 1) * 7 + (r * (t + 1)) % 5) % vocab));
    }
  Batch b;
  b.set("x", HostTensor::of(x, {rows, block}));
  b.set("y", HostTensor::of(y, {rows, block}));
  return b;
}
Batch image_rows(int step, std::int64_t first, std::int64_t rows) {
  std::vector<float> x;
  for (std::int64_t r = first; r < first + rows; ++r) {  // each row from its own seed: any split gives the same rows
    const auto v =
        random_values(static_cast<std::size_t>(3 * image * image), static_cast<std::uint64_t>(step * 1000 + r + 1));
    x.insert(x.end(), v.begin(), v.end());
  }
  std::vector<std::int32_t> y;
  for (std::int64_t r = first; r < first + rows; ++r)
    y.push_back(static_cast<std::int32_t>((r * 3 + step) % n_classes));
  Batch b;
  b.set("x", HostTensor::of(x, {rows, 3 * image * image}));
  b.set("y", HostTensor::of(y, {rows}));
  return b;
}

template <class Net>
auto wrap_lm(World& w, Net& net) {
  return libtorch::wrap(w, net, {net->embed, net->blocks, net->head}, torch::zeros({2, block}, torch::kLong));
}
template <class Net>
auto wrap_resnet(World& w, Net& net) {
  return libtorch::wrap(w, net, {net->stem, net->layers, net->head}, torch::zeros({2, 3 * image * image}));
}

// A host DeviceBatch over a host Batch (on Host the device pointer is the host one).
DeviceBatch torch_on_host(const Batch& host) {
  DeviceBatch b;
  for (const auto& [name, t] : host.tensors)
    b.set(name, DeviceTensor{t.type, t.shape, t.bytes.data(), t.bytes.data(), name});
  return b;
}

// The wrapped model's gradients of the mean cross-entropy over `batch`, by
// running its units by hand: forward, the loss's gradient, backward.
template <class Model>
Params unit_gradients(Model& model, const Batch& batch, std::int64_t time) {
  Host dev;
  const DeviceBatch db = torch_on_host(batch);
  const std::int64_t samples = batch.at("x").shape[0];
  const SeqShape shape{samples, time};
  struct U {
    std::vector<ParamSpec> specs;
    std::vector<std::vector<float>> values, grads;
    std::vector<MatView<const float>> p;
    std::vector<MatView<float>> g;
  };
  std::vector<U> units;
  auto add = [&](const auto& unit) {
    U u;
    u.specs = unit.params();
    for (const auto& s : u.specs) {
      u.values.push_back(*s.init.values);
      u.grads.emplace_back(s.init.values->size());
    }
    for (std::size_t i = 0; i < u.specs.size(); ++i) {
      const auto r = u.specs[i].shape[0];
      u.p.push_back({u.values[i].data(), r, static_cast<std::int64_t>(u.values[i].size()) / r});
      u.g.push_back({u.grads[i].data(), r, static_cast<std::int64_t>(u.grads[i].size()) / r});
    }
    units.push_back(std::move(u));
  };
  add(model.first);
  for (const auto& b : model.blocks) add(b);
  const std::int64_t rows0 = model.first.out_shape(shape, shape).rows();
  std::vector<std::vector<float>> acts;
  std::vector<std::int64_t> width;
  UnitContext<float> ctx{.shape = shape, .training = true};
  width.push_back(model.first.out_features(0));
  acts.emplace_back(static_cast<std::size_t>(rows0 * width[0]));
  model.first.forward(dev, UnitParams<const float>(units[0].p), db, MatView<float>{acts[0].data(), rows0, width[0]},
                      ctx);
  const SeqShape rows_shape = model.first.out_shape(shape, shape);
  UnitContext<float> bctx{.shape = rows_shape, .training = true};
  for (std::size_t k = 0; k < model.blocks.size(); ++k) {
    width.push_back(model.blocks[k].out_features(width.back()));
    acts.emplace_back(static_cast<std::size_t>(rows0 * width.back()));
    model.blocks[k].forward(dev, UnitParams<const float>(units[k + 1].p),
                            MatView<const float>{acts[k].data(), rows0, width[k]},
                            MatView<float>{acts[k + 1].data(), rows0, width[k + 1]}, bctx);
  }
  // d(mean cross-entropy)/dlogits, in double
  const auto& logits = acts.back();
  const std::int64_t c = width.back();
  const auto y = batch.at("y").values<std::int32_t>();
  std::vector<float> dy(logits.size());
  for (std::int64_t r = 0; r < rows0; ++r) {
    double m = -1e300, s = 0;
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, double(logits[static_cast<std::size_t>(r * c + j)]));
    for (std::int64_t j = 0; j < c; ++j) s += std::exp(double(logits[static_cast<std::size_t>(r * c + j)]) - m);
    for (std::int64_t j = 0; j < c; ++j) {
      const double p = std::exp(double(logits[static_cast<std::size_t>(r * c + j)]) - m) / s;
      dy[static_cast<std::size_t>(r * c + j)] =
          static_cast<float>((p - (j == y[static_cast<std::size_t>(r)] ? 1.0 : 0.0)) / double(rows0));
    }
  }
  for (std::size_t k = model.blocks.size(); k-- > 0;) {
    std::vector<float> dx(acts[k].size());
    model.blocks[k].backward(dev, UnitParams<const float>(units[k + 1].p), UnitParams<float>(units[k + 1].g),
                             MatView<const float>{acts[k].data(), rows0, width[k]},
                             MatView<const float>{acts[k + 1].data(), rows0, width[k + 1]},
                             MatView<const float>{dy.data(), rows0, width[k + 1]},
                             MatView<float>{dx.data(), rows0, width[k]}, bctx);
    dy = std::move(dx);
  }
  model.first.backward(dev, UnitParams<const float>(units[0].p), UnitParams<float>(units[0].g), db,
                       MatView<const float>{acts[0].data(), rows0, width[0]},
                       MatView<const float>{dy.data(), rows0, width[0]}, ctx);
  Params out;
  const auto names = libtorch::module_names(model);
  for (std::size_t u = 0; u < units.size(); ++u)
    for (std::size_t i = 0; i < units[u].specs.size(); ++i)
      out[names.at(std::to_string(u) + "." + units[u].specs[i].name)] = units[u].grads[i];
  return out;
}

// LibTorch's own backward of the whole module, in `dtype`.
template <class Net>
Params torch_gradients(Net& net, const Batch& batch, torch::Dtype dtype) {
  net->to(dtype);
  net->zero_grad();
  const auto& x = batch.at("x");
  at::Tensor input;
  if (x.type == element_type::i32)
    input = torch::from_blob(const_cast<std::byte*>(x.bytes.data()), x.shape, torch::kInt).to(torch::kLong);
  else
    input = torch::from_blob(const_cast<std::byte*>(x.bytes.data()), x.shape, torch::kFloat).to(dtype);
  const auto& yt = batch.at("y");
  at::Tensor y = torch::from_blob(const_cast<std::byte*>(yt.bytes.data()), yt.shape, torch::kInt).to(torch::kLong);
  at::Tensor logits = net->forward(input);
  at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
  loss.backward();
  Params out;
  for (const auto& item : net->named_parameters(true)) {
    at::Tensor g = item.value().grad().to(torch::kFloat).contiguous();
    out[item.key()] = std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  }
  return out;
}

// The largest |a - b| over every element, relative to the largest |b|.
double max_diff_rel_to_largest(const Params& a, const Params& b, std::string& where) {
  double worst = 0, largest = 0;
  for (const auto& [name, vb] : b)
    for (const float v : vb) largest = std::max(largest, double(std::abs(v)));
  for (const auto& [name, vb] : b) {
    const auto& va = a.at(name);
    for (std::size_t i = 0; i < vb.size(); ++i) {
      const double d = std::abs(double(va[i]) - double(vb[i])) / largest;
      if (d > worst) worst = d, where = name + "[" + std::to_string(i) + "]";
    }
  }
  return worst;
}

constexpr int train_steps = 3;
constexpr std::int64_t global_rows = 12;  // every step, split evenly over 1, 2 or 3 ranks and 2 micro-batches

// Trains `train_steps` AdamW steps of model `which` at n ranks with strategy Kind
// and A micro-batches, each rank's module built from its own seed (rank 0's
// weights win), and returns rank 0's parameters by the module's names.
template <class Kind, int A, class Prec>
Params train(const std::string& which, int n) {
  Params out;
  run_ranks(n, [&](World& w) {
    torch::set_num_threads(1);
    auto run = [&](auto net, auto model, auto rows_of) {
      Trainer<decltype(model), Device<Host>, Prec, Accumulate<A>, Strategy<Kind>> trainer(
          w, model, AdamW{.lr = 3e-3f, .weight_decay = 0.01f}, TrainerOptions{.seed = 7},
          kind_options<Kind>(n == 3 ? 3 : 1));
      const std::int64_t mine = global_rows / n, each = mine / A;
      for (int s = 0; s < train_steps; ++s) {
        std::vector<Batch> micro;
        for (int k = 0; k < A; ++k) micro.push_back(rows_of(s, w.rank() * mine + k * each, each));
        trainer.step(micro);
      }
      const auto names = libtorch::module_names(model);
      Params p;
      for (auto& [name, v] : trainer.parameters()) p[names.at(name)] = std::move(v);
      if (w.rank() == 0) out = std::move(p);
      (void)net;
    };
    const std::uint64_t seed = 100 + static_cast<std::uint64_t>(w.rank());
    if (which == "lm") {
      auto net = make_lm(seed);
      run(net, wrap_lm(w, net), lm_rows);
    } else {
      auto net = make_resnet(seed);
      run(net, wrap_resnet(w, net), image_rows);
    }
  });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(block_gradients_match_libtorch_backward_of_the_whole_module) {
  torch::set_num_threads(1);
  for (const std::string which : {"lm", "resnet"}) {
    auto worlds = make_local_worlds(1);
    const Batch batch = which == "lm" ? lm_rows(0, 0, 3) : image_rows(0, 0, 4);
    Params ours, theirs, exact;
    if (which == "lm") {
      auto net = make_lm(5);
      auto model = wrap_lm(worlds[0], net);
      ours = unit_gradients(model, batch, block);
      auto ref = make_lm(5);
      theirs = torch_gradients(ref, batch, torch::kFloat);
      auto ref64 = make_lm(5);
      exact = torch_gradients(ref64, batch, torch::kDouble);
    } else {
      auto net = make_resnet(5);
      auto model = wrap_resnet(worlds[0], net);
      ours = unit_gradients(model, batch, 1);
      auto ref = make_resnet(5);
      theirs = torch_gradients(ref, batch, torch::kFloat);
      auto ref64 = make_resnet(5);
      exact = torch_gradients(ref64, batch, torch::kDouble);
    }
    BOOST_TEST(ours.size() == theirs.size());
    std::string at;
    // the same LibTorch kernels on the same values; only the loss's gradient
    // is computed apart (in double here)
    const double d = max_diff_rel_to_largest(ours, theirs, at);
    BOOST_TEST(d <= 1e-6, which << ": " << d << " at " << at);
    // against float64: fp32 rounding through the blocks
    const double e = max_diff_rel_to_largest(ours, exact, at);
    BOOST_TEST(e <= 1e-4, which << " vs float64: " << e << " at " << at);
    BOOST_TEST_MESSAGE(which << ": gradients within " << d << " of LibTorch fp32, " << e << " of float64");
  }
}

BOOST_AUTO_TEST_CASE(every_strategy_at_1_2_3_ranks_trains_to_world_1_ddp) {
  for (const std::string which : {"lm", "resnet"}) {
    const Params ddp1 = train<DDP, 1, Precision<fp32>>(which, 1);
    Worst worst;
    auto check = [&](const Params& p, const std::string& what) {
      std::string at;
      worst.update(max_rel_diff(p, ddp1, &at), which + " " + what + " " + at);
    };
    check(train<DDP, 2, Precision<fp32>>(which, 1), "ddp accumulate 2 x1");
    for (const int n : {2, 3}) {
      const std::string w = " x" + std::to_string(n);
      check(train<DDP, 1, Precision<fp32>>(which, n), "ddp" + w);
      check(train<FSDP<FullShard>, 1, Precision<fp32>>(which, n), "fsdp-full" + w);
      check(train<FSDP<ShardGradOp>, 1, Precision<fp32>>(which, n), "fsdp-grad-op" + w);
      check(train<FSDP<NoShard>, 1, Precision<fp32>>(which, n), "fsdp-none" + w);
      check(train<FSDP<HybridShard>, 1, Precision<fp32>>(which, n), "fsdp-hybrid" + w);
      check(train<ZeRO1, 1, Precision<fp32>>(which, n), "zero1" + w);
    }
    check(train<FSDP<FullShard>, 2, Precision<fp32>>(which, 2), "fsdp-full accumulate 2 x2");
    check(train<FSDP<FullShard>, 1, Precision<fp32>>(which, 1), "fsdp-full x1");
    // the strategy tests' bound: fp32 sums in another order, then AdamW
    BOOST_TEST(worst.diff <= 5e-4, worst.diff << " at " << worst.where);
    BOOST_TEST_MESSAGE(which << ": every strategy within " << worst.diff << " of world-1 DDP (" << worst.where << ")");
  }
}

BOOST_AUTO_TEST_CASE(bf16_under_fsdp_at_2_ranks_follows_world_1) {
  const Params a = train<DDP, 1, Precision<bf16>>("lm", 1);
  const Params b = train<FSDP<FullShard>, 1, Precision<bf16>>("lm", 2);
  std::string at;
  const double d = max_rel_diff(b, a, &at);
  // bf16 activations rounded in different places (2 ranks' rows apart),
  // fp32 master weights: three AdamW steps of lr 3e-3 differ by a few bf16 ulps
  BOOST_TEST(d <= 2e-2, d << " at " << at);
}

BOOST_AUTO_TEST_CASE(the_ranks_start_from_rank_0s_module) {
  Params first;
  run_ranks(2, [&](World& w) {
    auto net = make_lm(300 + static_cast<std::uint64_t>(w.rank()));
    auto model = wrap_lm(w, net);
    Trainer<decltype(model), Device<Host>, Precision<fp32>, Strategy<FSDP<FullShard>>> trainer(w, model, AdamW{});
    const auto p = trainer.parameters();
    if (w.rank() == 0) first = p;
  });
  auto net = make_lm(300);
  auto worlds = make_local_worlds(1);
  auto model = wrap_lm(worlds[0], net);
  const auto names = libtorch::module_names(model);
  auto params = net->named_parameters(true);
  for (const auto& [name, v] : first) {
    at::Tensor t = params[names.at(name)].contiguous();
    BOOST_TEST(std::equal(v.begin(), v.end(), t.data_ptr<float>()), name);
  }
}

BOOST_AUTO_TEST_CASE(state_dicts_round_trip_and_checkpoints_reshard) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dtrain_torch_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  Params trained;
  run_ranks(2, [&](World& w) {
    torch::set_num_threads(1);
    auto net = make_resnet(11);
    auto model = wrap_resnet(w, net);
    Trainer<decltype(model), Device<Host>, Precision<fp32>, Strategy<FSDP<FullShard>>> trainer(w, model, AdamW{});
    for (int s = 0; s < 2; ++s) trainer.step(std::vector<Batch>{image_rows(s, w.rank() * 3, 3)});
    trainer.save(dir / "ckpt");
    libtorch::save_state_dict(trainer, model, dir / "model.safetensors");
    libtorch::copy_to_module(trainer, model);
    if (w.rank() == 0) {
      for (const auto& item : net->named_parameters(true)) {
        at::Tensor t = item.value().contiguous();
        trained[item.key()] = std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
      }
    }
  });
  // The file holds the module's names; a fresh module loads it.
  const auto file = SafetensorsFile::open(dir / "model.safetensors");
  auto fresh = make_resnet(12);
  for (const auto& item : fresh->named_parameters(true)) {
    BOOST_REQUIRE(file.contains(item.key()));
    const auto v = file.read_f32(item.key());
    BOOST_TEST(v == trained.at(item.key()), item.key());
  }
  // Resumed at 3 ranks under ZeRO-1: the same parameters; and the state
  // dict loads into a trainer of another world size.
  run_ranks(3, [&](World& w) {
    torch::set_num_threads(1);
    auto net = make_resnet(13);
    auto model = wrap_resnet(w, net);
    Trainer<decltype(model), Device<Host>, Precision<fp32>, Strategy<ZeRO1>> resumed(w, model, AdamW{});
    resumed.load(dir / "ckpt");
    const auto names = libtorch::module_names(model);
    for (const auto& [name, v] : resumed.parameters()) require(v == trained.at(names.at(name)), name + " resumed");
    auto net2 = make_resnet(14);
    auto model2 = wrap_resnet(w, net2);
    Trainer<decltype(model2), Device<Host>, Precision<fp32>, Strategy<DDP>> loaded(w, model2, AdamW{});
    const auto report = libtorch::load_state_dict(loaded, model2, dir / "model.safetensors");
    require(report.missing.empty(), "missing tensors");
    for (const auto& [name, v] : loaded.parameters()) require(v == trained.at(names.at(name)), name + " loaded");
  });
  fs::remove_all(dir);
}

namespace {
// Two blocks that share one parameter (registered in both).
struct ScaleImpl : torch::nn::Module {
  explicit ScaleImpl(torch::Tensor w) : w(register_parameter("w", w)) {}
  torch::Tensor forward(torch::Tensor x) { return x * w; }
  torch::Tensor w;
};
TORCH_MODULE(Scale);
struct TwoImpl : torch::nn::Module {
  explicit TwoImpl(torch::Tensor w) : a(register_module("a", Scale(w))), b(register_module("b", Scale(w))) {}
  Scale a, b;
};
TORCH_MODULE(Two);

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

BOOST_AUTO_TEST_CASE(bad_modules_are_named) {
  auto worlds = make_local_worlds(1);
  auto net = make_lm(1);
  const auto ids = torch::zeros({2, block}, torch::kLong);
  const std::string left = message_of([&] { libtorch::wrap(worlds[0], net, {net->embed, net->blocks}, ids); });
  BOOST_TEST(left.find("leave out") != std::string::npos, left);
  BOOST_TEST(left.find("head.out.weight") != std::string::npos, left);

  Two two(torch::ones({4}));
  const std::string shared = message_of([&] { libtorch::wrap(worlds[0], two, {two->a, two->b}, torch::ones({2, 4})); });
  BOOST_TEST(shared.find("is in block 'a' and in block 'b'") != std::string::npos, shared);

  const std::string device = message_of([&] {
    libtorch::wrap(worlds[0], net, {net->embed, net->blocks, net->head}, ids, {.device = libtorch::device_kind::cuda});
  });
  BOOST_TEST(device.find("is on cpu but the Trainer computes on cuda") != std::string::npos, device);

  auto other = make_lm(2);
  const std::string foreign = message_of([&] {
    libtorch::wrap(worlds[0], net, {net->embed, other->blocks, net->head}, ids);
  });
  BOOST_TEST(foreign.find("not a submodule") != std::string::npos, foreign);
}

namespace {
// A torch::data dataset as LibTorch users write one: sample i's features and class.
struct Features : torch::data::datasets::Dataset<Features> {
  torch::data::Example<> get(std::size_t i) override {
    const auto x = torch::arange(8, torch::kFloat) * 0.1f + static_cast<float>(i % 6) - 3.f;  // x decides the class
    return {x, torch::tensor(static_cast<std::int64_t>(i % 3))};
  }
  torch::optional<std::size_t> size() const override { return 60; }
};

struct TinyImpl : torch::nn::Module {
  TinyImpl()
      : body(register_module("body", torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU()))),
        head(register_module("head", torch::nn::Linear(16, 3))) {}
  torch::nn::Sequential body;
  torch::nn::Linear head;
};
TORCH_MODULE(Tiny);
}  // namespace

BOOST_AUTO_TEST_CASE(a_torch_data_dataset_trains_through_fit_on_2_ranks) {
  const libtorch::DataSource<Features> source{Features{}};
  BOOST_TEST(source.size() == 60);
  const std::vector<std::int64_t> idx{4, 11};
  const Batch b = source.gather(idx);
  BOOST_TEST((b.at("x").shape == std::vector<std::int64_t>{2, 8}));
  BOOST_TEST((b.at("y").values<std::int64_t>()[1] == 11 % 3));
  BOOST_TEST(b.at("x").values<float>()[8] == 0.f * 0.1f + 11 % 6 - 3.f);
  std::vector<double> losses(2);
  run_ranks(2, [&](World& w) {
    torch::set_num_threads(1);
    Tiny net;
    {
      std::lock_guard lock(construct);
      torch::manual_seed(3);
      net = Tiny();
    }
    auto model = libtorch::wrap(w, net, {net->body, net->head}, torch::zeros({1, 8}));
    Trainer<decltype(model), Device<Host>, Precision<fp32>, Strategy<FSDP<FullShard>>> trainer(w, model,
                                                                                               AdamW{.lr = 3e-2f});
    const auto first = trainer.evaluate(std::vector<Batch>{source.gather(std::vector<std::int64_t>{0, 1, 2, 3, 4, 5})});
    fit(trainer, source, FitOptions{.steps = 80, .batch_size = 6, .num_workers = 0, .log_every = 80});
    const auto last = trainer.evaluate(std::vector<Batch>{source.gather(std::vector<std::int64_t>{0, 1, 2, 3, 4, 5})});
    if (w.rank() == 0) losses = {first.loss, last.loss};
  });
  BOOST_TEST(losses[1] < 0.5 * losses[0], losses[0] << " -> " << losses[1]);
}

namespace {
// One block with Dropout and a BatchNorm (whose running statistics forward updates).
struct NoisyImpl : torch::nn::Module {
  NoisyImpl()
      : fc1(register_module("fc1", torch::nn::Linear(6, 10))),
        drop(register_module("drop", torch::nn::Dropout(0.5))),
        bn(register_module("bn", torch::nn::BatchNorm1d(10))),
        fc2(register_module("fc2", torch::nn::Linear(10, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(bn(drop(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Noisy);
struct HolderImpl : torch::nn::Module {
  HolderImpl() : block(register_module("block", Noisy())) {}
  Noisy block;
};
TORCH_MODULE(Holder);
}  // namespace

// FSDP may gather a block's parameters elsewhere for its backward than for
// its forward; the block's forward is then recomputed: the same Dropout
// masks, the same gradients, and BatchNorm's statistics updated once.
BOOST_AUTO_TEST_CASE(a_recomputed_block_gives_the_recorded_graphs_gradients) {
  torch::set_num_threads(1);
  auto worlds = make_local_worlds(1);
  Holder net;
  auto model = libtorch::wrap(worlds[0], net, {net->block}, torch::zeros({2, 6}));
  const auto v = random_values(5 * 6, 17);
  const Batch batch = [&] {
    Batch b;
    b.set("x", HostTensor::of(std::vector<float>(v.begin(), v.end()), {5, 6}));
    return b;
  }();
  const DeviceBatch db = torch_on_host(batch);
  const auto specs = model.first.params();
  std::vector<at::Tensor> start_buffers;
  for (const auto& b : net->buffers()) start_buffers.push_back(b.clone());
  const auto dyv = random_values(5 * 3, 18);
  std::vector<float> dy(dyv.begin(), dyv.end());
  // forward on one copy of the parameters, backward on `moved` (the same values elsewhere, or the same memory)
  auto run = [&](bool moved, std::vector<std::vector<float>>& grads, std::vector<at::Tensor>& buffers) {
    {
      torch::NoGradGuard no_grad;
      std::size_t i = 0;
      for (auto& b : net->buffers()) b.copy_(start_buffers[i++]);
    }
    std::vector<std::vector<float>> a, b;
    std::vector<MatView<const float>> pa, pb;
    std::vector<MatView<float>> g;
    grads.clear();
    for (const auto& s : specs) {
      a.push_back(*s.init.values);
      b.push_back(*s.init.values);
      grads.emplace_back(s.init.values->size());
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto r = specs[i].shape[0], c = static_cast<std::int64_t>(a[i].size()) / r;
      pa.push_back({a[i].data(), r, c});
      pb.push_back({b[i].data(), r, c});
      g.push_back({grads[i].data(), r, c});
    }
    Host dev;
    std::vector<float> y(15);
    const UnitContext<float> ctx{.shape = {5, 1}, .training = true};
    torch::manual_seed(9);
    model.first.forward(dev, UnitParams<const float>(pa), db, MatView<float>{y.data(), 5, 3}, ctx);
    torch::manual_seed(1234);  // other draws between forward and backward
    (void)torch::rand({7});
    model.first.backward(dev, UnitParams<const float>(moved ? pb : pa), UnitParams<float>(g), db,
                         MatView<const float>{y.data(), 5, 3}, MatView<const float>{dy.data(), 5, 3}, ctx);
    buffers.clear();
    for (const auto& buf : net->buffers()) buffers.push_back(buf.clone());
  };
  std::vector<std::vector<float>> kept, recomputed;
  std::vector<at::Tensor> kept_buffers, recomputed_buffers;
  run(false, kept, kept_buffers);
  BOOST_TEST(model.recomputed() == 0);
  run(true, recomputed, recomputed_buffers);
  BOOST_TEST(model.recomputed() == 1);
  for (std::size_t i = 0; i < kept.size(); ++i) BOOST_TEST((kept[i] == recomputed[i]), specs[i].name);
  for (std::size_t i = 0; i < kept_buffers.size(); ++i) BOOST_TEST(kept_buffers[i].equal(recomputed_buffers[i]));
  BOOST_TEST(!kept_buffers[0].equal(start_buffers[0]));  // forward did update the running mean
}
