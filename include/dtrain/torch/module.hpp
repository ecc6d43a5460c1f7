#pragma once
// A LibTorch module trained by dtrain: the three lines a LibTorch program
// changes (docs/libtorch.md),
//
//   #include <dtrain/torch/module.hpp>
//   auto model = dtrain::libtorch::wrap(world, net, {net->embed, net->blocks, net->head}, example);
//   dtrain::Trainer<...> trainer(world, model, ...);    // instead of its own loop's optimizer
//
// wrap() names the module's blocks (each a dtrain unit: dtrain/torch/block.hpp),
// checks that they cover every parameter exactly once, runs them once on
// `example` to learn each block's output width, and takes the module's
// current values as the initial parameters (rank 0's, when the ranks'
// differ: as PyTorch's DDP broadcasts them). The weights come back out by
// the module's own names (save_state_dict: a safetensors file Python's
// load_state_dict takes; copy_to_module: into the module itself).
//
// Needs LibTorch (its CMake package Torch; dtrain::torch links it).

#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/io/safetensors.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/torch/block.hpp"

#if !defined(TORCH_VERSION_MAJOR) || (TORCH_VERSION_MAJOR < 1) || (TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR < 13)
#error "dtrain::libtorch needs LibTorch 1.13 or newer (Debian's libtorch-dev, or the LibTorch inside PyPI's torch)"
#endif

namespace dtrain::libtorch {

namespace detail {

inline c10::ScalarType scalar_type(element_type t) {
  switch (t) {
    case element_type::f32: return c10::ScalarType::Float;
    case element_type::f64: return c10::ScalarType::Double;
    case element_type::bf16: return c10::ScalarType::BFloat16;
    case element_type::f16: return c10::ScalarType::Half;
    case element_type::i32: return c10::ScalarType::Int;
    case element_type::i64: return c10::ScalarType::Long;
    case element_type::u8: return c10::ScalarType::Byte;
    default: break;
  }
  throw config_error("an element type LibTorch has no counterpart for", "use f32, bf16, f16, i32, i64 or u8");
}

inline std::optional<element_type> element_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return element_type::f32;
    case c10::ScalarType::Double: return element_type::f64;
    case c10::ScalarType::BFloat16: return element_type::bf16;
    case c10::ScalarType::Half: return element_type::f16;
    case c10::ScalarType::Int: return element_type::i32;
    case c10::ScalarType::Long: return element_type::i64;
    case c10::ScalarType::Byte: return element_type::u8;
    default: return std::nullopt;
  }
}

inline std::string sizes_text(at::IntArrayRef s) {
  std::vector<std::int64_t> v(s.begin(), s.end());
  return shape_text(v);
}

inline c10::Device torch_device(device_kind d, int index) {
  return d == device_kind::host ? c10::Device(c10::kCPU)
                                : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// A LibTorch tensor over memory dtrain owns (no copy, no ownership).
inline at::Tensor view_of(const void* p, std::vector<std::int64_t> shape, element_type t, device_kind d, int index) {
  return torch::from_blob(const_cast<void*>(p), shape,
                          torch::TensorOptions().dtype(scalar_type(t)).device(torch_device(d, index)));
}

// One parameter of a block: the module's tensor and its names.
struct BlockParam {
  std::string local;   // within the block ("weight")
  std::string global;  // within the module ("layers.0.weight")
  at::Tensor tensor;   // the module's Parameter (rebound to dtrain's memory on each call)
};

}  // namespace detail

// A block as the user names it: a module with forward(Tensor) -> Tensor
// (any ModuleHolder, e.g. torch::nn::Linear or a TORCH_MODULE of your own),
// or a torch::nn::Sequential, whose elements become one block each.
class BlockRef {
 public:
  template <class Impl>
  BlockRef(const torch::nn::ModuleHolder<Impl>& holder) {  // NOLINT: implicit, for wrap's braced list
    if constexpr (std::is_same_v<Impl, torch::nn::SequentialImpl>) {
      for (const auto& m : *holder) parts_.push_back({m.ptr(), m});
    } else {
      parts_.push_back({holder.ptr(), torch::nn::AnyModule(holder)});
    }
  }
  // A callable over a module of yours whose forward takes more than a tensor.
  BlockRef(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward)
      : parts_{{std::move(module), {}}}, call_(std::move(forward)) {}

  struct Part {
    std::shared_ptr<torch::nn::Module> module;
    torch::nn::AnyModule any;
  };
  const std::vector<Part>& parts() const { return parts_; }
  const std::function<at::Tensor(const at::Tensor&)>& call() const { return call_; }

 private:
  std::vector<Part> parts_;
  std::function<at::Tensor(const at::Tensor&)> call_;
};

struct WrapOptions {
  // The device the Trainer computes on; every parameter and buffer of the
  // module must be there (host: CPU tensors).
  device_kind device = device_kind::host;
  // The batch tensor the first block reads.
  std::string input = "x";
};

namespace detail {

// The LibTorch side of one block (BlockRunner).
class TorchRunner final : public BlockRunner {
 public:
  TorchRunner(std::string name, std::shared_ptr<torch::nn::Module> module,
              std::function<at::Tensor(const at::Tensor&)> call, std::vector<BlockParam> params,
              std::vector<std::int64_t> in_row_shape, std::vector<std::int64_t> out_row_shape, bool first)
      : name_(std::move(name)),
        module_(std::move(module)),
        call_(std::move(call)),
        params_(std::move(params)),
        in_row_(std::move(in_row_shape)),
        out_row_(std::move(out_row_shape)),
        first_(first) {}

  void forward(const BlockCall& c) override {
    saved_.reset();
    // LibTorch's intra-op threads: as many as dtrain computes with on this
    // rank (cores / ranks on the node), whose own threads are idle meanwhile.
    if (c.threads > 0 && at::get_num_threads() != c.threads) at::set_num_threads(c.threads);
    // train(): Dropout drops, BatchNorm uses and updates the batch's
    // statistics; eval() for evaluate and generation.
    if (module_->is_training() != c.training) module_->train(c.training);
    if (!c.training) {
      torch::NoGradGuard no_grad;
      run(c);
    } else {
      torch::AutoGradMode grad(true);
      rng_ = random_state(c);  // a recomputed forward draws the same Dropout masks
      saved_ = run(c);
    }
    finish(c);
  }

  void backward(const BlockCall& c) override {
    std::vector<at::Tensor> buffers;  // as forward left them, when forward is recomputed
    if (!saved_ || saved_->x != c.x || saved_->params != c.params) {
      // FSDP gathered the parameters elsewhere since forward (or nothing was
      // recorded): the graph would read freed memory, so run forward again
      // on the kept input, leaving the module's buffers as forward left them.
      for (const auto& b : module_->buffers()) buffers.push_back(b.clone());
      const at::Tensor now = random_state(c);
      if (rng_.defined()) set_random_state(c, rng_);
      {
        torch::AutoGradMode grad(true);
        saved_ = run(c, /*write_y=*/false);
      }
      set_random_state(c, now);
      ++recomputed_;
    }
    Saved s = std::move(*saved_);
    saved_.reset();
    std::vector<at::Tensor> inputs;
    std::vector<std::size_t> which;  // params_ index of each input after the first `with_x`
    const bool with_x = c.dx != nullptr && s.input.requires_grad();
    if (with_x) inputs.push_back(s.input);
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (c.grads[i] != nullptr) {
        inputs.push_back(s.bound[i]);
        which.push_back(i);
      }
    const std::int64_t width = s.output.numel() / std::max<std::int64_t>(c.rows, 1);
    at::Tensor dy = view_of(c.dy, {c.rows, width}, c.dtype, c.device, c.device_index).view(s.output.sizes());
    std::vector<at::Tensor> g;
    if (!inputs.empty())
      g = torch::autograd::grad({s.output}, inputs, {dy}, /*retain_graph=*/false, /*create_graph=*/false,
                                /*allow_unused=*/true);
    torch::NoGradGuard no_grad;
    // The buffers back as forward left them (BatchNorm's statistics updated
    // once), after the graph that saved them has run.
    if (!buffers.empty()) {
      std::size_t i = 0;
      for (auto& b : module_->buffers()) b.copy_(buffers[i++]);
    }
    std::size_t k = 0;
    if (with_x) {
      at::Tensor dx = view_of(c.dx, c.x_shape, c.dtype, c.device, c.device_index);
      if (g[k].defined())
        dx.copy_(g[k].reshape(dx.sizes()));
      else
        dx.zero_();
      ++k;
    } else if (c.dx != nullptr) {
      view_of(c.dx, c.x_shape, c.dtype, c.device, c.device_index).zero_();
    }
    for (const std::size_t i : which) {
      const auto& spec = params_[i].tensor;
      at::Tensor out = view_of(c.grads[i], spec.sizes().vec(), c.dtype, c.device, c.device_index);
      if (g[k].defined())
        out.copy_(g[k]);
      else
        out.zero_();
      ++k;
    }
    finish(c);
  }

  std::int64_t recomputed() const override { return recomputed_; }

  const std::vector<BlockParam>& params() const { return params_; }
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

 private:
  struct Saved {
    const void* x = nullptr;
    std::vector<void*> params;
    std::vector<at::Tensor> bound;  // the parameters as forward saw them
    at::Tensor input;
    at::Tensor output;
  };

  // The block's forward on the call's memory: parameters bound to dtrain's
  // views, the input viewed in the shape the block takes.
  Saved run(const BlockCall& c, bool write_y = true) {
    Saved s;
    s.x = c.x;
    s.params = c.params;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      at::Tensor v = view_of(c.params[i], params_[i].tensor.sizes().vec(), c.dtype, c.device, c.device_index);
      {
        torch::NoGradGuard no_grad;
        params_[i].tensor.set_data(v);
      }
      s.bound.push_back(params_[i].tensor);
    }
    if (first_) {
      at::Tensor x = view_of(c.x, c.x_shape, c.x_type, c.device, c.device_index);
      // LibTorch's embeddings take int64 ids (and take int32 only in some versions).
      if (x.scalar_type() == c10::ScalarType::Int) x = x.to(c10::ScalarType::Long);
      if (at::isFloatingType(x.scalar_type()) && x.scalar_type() != scalar_type(c.dtype))
        x = x.to(scalar_type(c.dtype));
      s.input = x;
    } else {
      std::vector<std::int64_t> shape{c.shape.batch};
      if (c.shape.time > 1) shape.push_back(c.shape.time);
      shape.insert(shape.end(), in_row_.begin(), in_row_.end());
      at::Tensor x = view_of(c.x, c.x_shape, c.dtype, c.device, c.device_index).view(shape);
      if (c.training) x = x.detach().requires_grad_(true);
      s.input = x;
    }
    at::Tensor out = call_(s.input);
    if (!out.defined() || out.numel() % std::max<std::int64_t>(c.rows, 1) != 0 ||
        (c.rows > 0 && out.numel() / c.rows != row_width()))
      throw config_error("LibTorch block '" + name_ + "' returned " +
                             (out.defined() ? sizes_text(out.sizes()) : std::string("an undefined tensor")) +
                             " where its rows take " + std::to_string(c.rows) + " x " + std::to_string(row_width()) +
                             " (as the example input gave)",
                         "keep each block's output per sample the same for every batch: [B, ...] or [B, T, ...]");
    if (out.scalar_type() != scalar_type(c.dtype)) out = out.to(scalar_type(c.dtype));
    if (write_y) {
      torch::NoGradGuard no_grad;
      view_of(c.y, {c.rows, row_width()}, c.dtype, c.device, c.device_index).copy_(out.reshape({c.rows, row_width()}));
    }
    s.output = out;
    return s;
  }

  // dtrain reads y and the gradients on its own stream next: LibTorch's
  // work on the GPU must be done (the block waited for dtrain's before).
  static void finish(const BlockCall& c) {
    if (c.device == device_kind::cuda) torch::cuda::synchronize(c.device_index);
  }

  // LibTorch's default generator of the call's device.
  static at::Generator generator(const BlockCall& c) {
    return at::globalContext().defaultGenerator(torch_device(c.device, c.device_index));
  }
  static at::Tensor random_state(const BlockCall& c) {
    at::Generator g = generator(c);
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.get_state();
  }
  static void set_random_state(const BlockCall& c, const at::Tensor& state) {
    at::Generator g = generator(c);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  }

  std::int64_t row_width() const {
    std::int64_t w = 1;
    for (const auto e : out_row_) w *= e;
    return w;
  }

  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  std::function<at::Tensor(const at::Tensor&)> call_;
  std::vector<BlockParam> params_;
  std::vector<std::int64_t> in_row_, out_row_;
  bool first_ = false;
  std::optional<Saved> saved_;
  at::Tensor rng_;  // the generator's state when the recorded forward began
  std::int64_t recomputed_ = 0;
};

// What kind of parameter this is, for parameter groups ("tag:bias",
// "tag:norm": the examples' no_decay): from the class of the module that
// holds it (a normalisation's gains and shifts, an embedding's table) and
// its name (a bias).
inline std::vector<std::string> tags_of(torch::nn::Module& block, const std::string& local, const at::Tensor& t) {
  const auto dot = local.rfind('.');
  const std::string owner_path = dot == std::string::npos ? "" : local.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? local : local.substr(dot + 1);
  std::string kind = block.name();
  for (const auto& item : block.named_modules("", false))
    if (item.key() == owner_path) kind = item.value()->name();
  if (kind.find("Norm") != std::string::npos) return {"norm"};
  if (kind.find("Embedding") != std::string::npos) return {"embedding"};
  if (leaf == "bias" && t.dim() == 1) return {"bias"};
  return {};
}

inline std::string join(const std::vector<std::string>& v, std::size_t most = 8) {
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < most; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > most) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

// Every rank's initial values equal rank 0's: a hash per rank, and rank 0's
// values through the rendezvous store only when they differ.
inline void agree_on_values(World& world, std::vector<std::vector<float>>& values) {
  if (world.size() == 1) return;
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& v : values)
    for (const float x : v) h = (h ^ std::bit_cast<std::uint32_t>(x)) * 0x100000001b3ull;
  const auto all = world.all_gather("libtorch initial values", h);
  bool same = true;
  for (const auto x : all) same = same && x == all[0];
  const std::string prefix = world.next_prefix("libtorch_init");
  if (same) return;
  if (world.rank() == 0) {
    for (std::size_t i = 0; i < values.size(); ++i)
      world.store()->set(prefix + std::to_string(i),
                         std::string_view(reinterpret_cast<const char*>(values[i].data()), values[i].size() * 4));
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::string bytes = world.store()->get(prefix + std::to_string(i));
      if (bytes.size() != values[i].size() * 4)
        throw config_error("rank 0's LibTorch module has a parameter of " + std::to_string(bytes.size() / 4) +
                               " values where this rank's has " + std::to_string(values[i].size()),
                           "build the same module on every rank");
      std::memcpy(values[i].data(), bytes.data(), bytes.size());
    }
  }
  world.barrier("libtorch initial values");
}

}  // namespace detail

// `net`'s blocks as a dtrain model whose loss is `loss` (default: softmax
// cross-entropy over the last block's output rows and the batch's "y").
// `example`: an input like the batch's "x" (any batch and sequence size),
// run once through the blocks without a graph. Collective (the initial
// values): every rank calls it.
template <class Loss = nn::SoftmaxCrossEntropy, class Net>
Model<Loss> wrap(World& world, const Net& net, const std::vector<BlockRef>& blocks, const at::Tensor& example,
                 WrapOptions options = {}, Loss loss = {}) {
  std::shared_ptr<torch::nn::Module> root = net.ptr();
  if (root == nullptr) throw config_error("dtrain::libtorch::wrap: the module is empty", "pass a constructed module");
  // Names of every submodule, by address.
  std::map<const torch::nn::Module*, std::string> module_names;
  for (const auto& item : root->named_modules("", /*include_self=*/true))
    module_names.emplace(item.value().get(), item.key());
  // Every parameter of the module, by its tensor: name and whether a block has it.
  std::map<const void*, std::string> all_params;
  for (const auto& item : root->named_parameters(/*recurse=*/true))
    all_params.emplace(item.value().unsafeGetTensorImpl(), item.key());
  const c10::Device want = detail::torch_device(options.device, 0);
  for (const auto& item : root->named_parameters(true))
    if (item.value().device().type() != want.type())
      throw config_error("the LibTorch module's parameter '" + item.key() + "' is on " + item.value().device().str() +
                             " but the Trainer computes on " + want.str(),
                         "move the module to the trainer's device before wrapping it (net->to(...)), or train on the "
                         "device the module is on");
  for (const auto& item : root->named_buffers(true))
    if (item.value().device().type() != want.type())
      throw config_error("the LibTorch module's buffer '" + item.key() + "' is on " + item.value().device().str() +
                             " but the Trainer computes on " + want.str(),
                         "move the module to the trainer's device before wrapping it (net->to(...))");

  struct Found {
    std::string name;
    std::shared_ptr<torch::nn::Module> module;
    std::function<at::Tensor(const at::Tensor&)> call;
  };
  std::vector<Found> found;
  for (const auto& ref : blocks)
    for (const auto& part : ref.parts()) {
      const auto it = module_names.find(part.module.get());
      if (it == module_names.end())
        throw config_error("a block given to dtrain::libtorch::wrap is not a submodule of the module",
                           "name the module's own submodules (registered with register_module)");
      std::function<at::Tensor(const at::Tensor&)> call = ref.call();
      if (!call) {
        if (part.any.is_empty())
          throw config_error("block '" + it->second + "' has no forward(Tensor) dtrain can call",
                             "pass a ModuleHolder, a Sequential, or BlockRef(module, callable)");
        call = [any = part.any](const at::Tensor& x) mutable { return any.forward(x); };
      }
      found.push_back({it->second.empty() ? std::string("(the module)") : it->second, part.module, std::move(call)});
    }
  if (found.empty()) throw config_error("dtrain::libtorch::wrap got no blocks", "name the module's blocks in order");

  // Which block holds each parameter: each exactly once.
  std::map<const void*, std::string> owner;
  std::vector<std::vector<detail::BlockParam>> params(found.size());
  for (std::size_t b = 0; b < found.size(); ++b) {
    const std::string prefix = found[b].name == "(the module)" ? "" : found[b].name + ".";
    std::set<const void*> seen;
    for (const auto& item : found[b].module->named_parameters(true)) {
      const void* impl = item.value().unsafeGetTensorImpl();
      if (!seen.insert(impl).second) continue;  // one tensor under two names inside the block
      const auto o = owner.find(impl);
      if (o != owner.end())
        throw config_error(
            "parameter '" + all_params[impl] + "' is in block '" + o->second + "' and in block '" + found[b].name + "'",
            "a parameter shared between blocks (tied weights) is not supported yet: put the modules "
            "that share it into one block");
      owner.emplace(impl, found[b].name);
      params[b].push_back({item.key(), all_params.count(impl) ? all_params[impl] : prefix + item.key(), item.value()});
    }
  }
  std::vector<std::string> left_out;
  for (const auto& [impl, name] : all_params)
    if (!owner.count(impl)) left_out.push_back(name);
  if (!left_out.empty())
    throw config_error(
        "the blocks given to dtrain::libtorch::wrap leave out the module's parameter(s) " + detail::join(left_out),
        "name blocks that cover every parameter (the submodules holding them), or freeze them "
        "outside the module");

  // The example through the blocks: each block's output per row.
  std::vector<std::vector<std::int64_t>> out_rows(found.size());
  bool keeps_time = false;
  {
    torch::NoGradGuard no_grad;
    const bool ids = !at::isFloatingType(example.scalar_type());
    if (example.dim() < 2)
      throw config_error("the example input is " + detail::sizes_text(example.sizes()),
                         "give an input like the batch's x: token ids [B, T], or features [B, F] / [B, T, F]");
    const std::int64_t time = ids || example.dim() >= 3 ? example.size(1) : 1;
    at::Tensor h = example;
    if (h.scalar_type() == c10::ScalarType::Int) h = h.to(c10::ScalarType::Long);
    for (std::size_t b = 0; b < found.size(); ++b) {
      h = found[b].call(h);
      if (!h.defined() || h.dim() < 1 || h.size(0) != example.size(0))
        throw config_error("LibTorch block '" + found[b].name + "' turned the example's " +
                               std::to_string(example.size(0)) + " samples into " +
                               (h.defined() ? detail::sizes_text(h.sizes()) : std::string("nothing")),
                           "each block must keep the batch dimension first: [B, ...] or [B, T, ...]");
      std::size_t lead = 1;
      if (b == 0) keeps_time = time > 1 && h.dim() >= 2 && h.size(1) == time;
      if (keeps_time) {
        if (h.dim() < 2 || h.size(1) != time)
          throw config_error("LibTorch block '" + found[b].name + "' returned " + detail::sizes_text(h.sizes()) +
                                 " from a sequence of " + std::to_string(time),
                             "keep [B, T, ...] through every block after the first");
        lead = 2;
      }
      out_rows[b].assign(h.sizes().begin() + static_cast<std::ptrdiff_t>(lead), h.sizes().end());
      if (!at::isFloatingType(h.scalar_type()))
        throw config_error(
            "LibTorch block '" + found[b].name + "' returns " + std::string(c10::toString(h.scalar_type())),
            "blocks return floating-point activations");
    }
  }

  // The initial values: the module's, rank 0's where the ranks' differ.
  std::vector<std::vector<float>> values;
  for (const auto& ps : params)
    for (const auto& p : ps) {
      at::Tensor f = p.tensor.detach().to(c10::kCPU, c10::ScalarType::Float).contiguous();
      values.emplace_back(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
    }
  detail::agree_on_values(world, values);

  Model<Loss> model;
  model.loss = std::move(loss);
  model.module = root;
  model.rank = world.rank();
  std::size_t v = 0;
  for (std::size_t b = 0; b < found.size(); ++b) {
    std::vector<ParamSpec> specs;
    for (const auto& p : params[b]) {
      ParamSpec s;
      s.name = p.local;
      s.shape = p.tensor.sizes().vec();
      s.init = Init::given(std::move(values[v++]));
      s.trainable = p.tensor.requires_grad();
      s.tags = detail::tags_of(*found[b].module, p.local, p.tensor);
      specs.push_back(std::move(s));
      model.names.emplace_back(std::to_string(b) + "." + p.local, p.global);
    }
    std::int64_t out = 1;
    for (const auto e : out_rows[b]) out *= e;
    auto runner = std::make_shared<detail::TorchRunner>(found[b].name, found[b].module, found[b].call, params[b],
                                                        b == 0 ? std::vector<std::int64_t>{} : out_rows[b - 1],
                                                        out_rows[b], b == 0);
    if (b == 0) {
      model.first = InputBlock(found[b].name, std::move(specs), out, runner, keeps_time, options.input);
    } else {
      std::int64_t in = 1;
      for (const auto e : out_rows[b - 1]) in *= e;
      model.blocks.emplace_back(found[b].name, std::move(specs), in, out, runner);
    }
  }
  return model;
}

// The module's parameter names of a wrapped model's parameters:
// "<unit>.<param>" -> "layers.0.weight".
template <class Loss>
std::map<std::string, std::string> module_names(const Model<Loss>& model) {
  return {model.names.begin(), model.names.end()};
}

// The trained parameters into the module itself (owned CPU or GPU tensors,
// as the module's were), so it can be used, saved with torch::save or
// wrapped again after training. Collective.
template <class Trainer, class Loss>
void copy_to_module(Trainer& trainer, Model<Loss>& model) {
  std::vector<detail::TorchRunner*> all{&dynamic_cast<detail::TorchRunner&>(model.first.runner())};
  for (auto& b : model.blocks) all.push_back(&dynamic_cast<detail::TorchRunner&>(b.runner()));
  trainer.visit_parameters([&](const ParamSlot& slot, std::vector<float>&& values) {
    const auto dot = slot.name.find('.');
    const std::size_t unit = std::stoul(slot.name.substr(0, dot));
    const std::string local = slot.name.substr(dot + 1);
    for (const auto& p : all.at(unit)->params())
      if (p.local == local) {
        torch::NoGradGuard no_grad;
        at::Tensor t = torch::from_blob(values.data(), p.tensor.sizes(), torch::kFloat).clone();
        const c10::Device device = p.tensor.device();
        at::Tensor data = t.to(device, c10::ScalarType::Float);
        const_cast<at::Tensor&>(p.tensor).set_data(data);
      }
  });
}

// Every parameter by the module's names, F32, and the module's buffers
// (rank 0's: BatchNorm's running statistics), as one safetensors file
// Python loads with model.load_state_dict(safetensors.torch.load_file(path)).
// Collective; rank 0 writes.
// save_state_dict_from(visit, ...): the same from visit(f), which calls
// f(slot, values) for every parameter (Trainer::visit_parameters).
template <class Visit, class Loss>
void save_state_dict_from(Visit&& visit, const Model<Loss>& model, const std::filesystem::path& path) {
  const auto names = module_names(model);
  std::vector<std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>> tensors;
  visit([&](const ParamSlot& slot, std::vector<float>&& values) {
    if (model.rank == 0) tensors.push_back({names.at(slot.name), {slot.spec.shape, std::move(values)}});
  });
  if (model.rank != 0) return;
  SafetensorsWriter writer;
  for (const auto& [name, t] : tensors) writer.add(name, t.first, t.second);
  std::vector<at::Tensor> buffers;  // alive until the file is written
  const auto root = std::static_pointer_cast<torch::nn::Module>(model.module);
  for (const auto& item : root->named_buffers(true)) {
    at::Tensor t = item.value().detach().to(c10::kCPU).contiguous();
    const auto type = detail::element_of(t.scalar_type());
    if (!type) continue;  // a buffer dtype safetensors' readers here do not take
    buffers.push_back(t);
    writer.add(
        item.key(), *type, t.sizes().vec(),
        std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes())));
  }
  writer.write(path);
}

template <class Trainer, class Loss>
void save_state_dict(Trainer& trainer, const Model<Loss>& model, const std::filesystem::path& path) {
  save_state_dict_from([&](const auto& f) { trainer.visit_parameters(f); }, model, path);
}

// Parameters from a safetensors file named as the module names them (a
// Python state dict saved with safetensors.torch.save_file, or
// save_state_dict's file), at any world size and strategy. Collective.
// The module's buffers in the file (BatchNorm's running statistics) go
// into the module on every rank.
// load_state_dict_with(load, ...): the same through load(sources, options)
// (Trainer::load_params).
template <class Load, class Loss>
LoadParamsReport load_state_dict_with(Load&& load, Model<Loss>& model, const std::filesystem::path& path,
                                      const LoadParamsOptions& options = {}) {
  ParamSources sources;
  sources.what = "'" + path.string() + "'";
  sources.files.push_back(SafetensorsFile::open(path));
  const auto root = std::static_pointer_cast<torch::nn::Module>(model.module);
  std::map<std::string, at::Tensor> buffers;
  for (const auto& item : root->named_buffers(true)) buffers.emplace(item.key(), item.value());
  std::map<std::string, std::string> to_unit;
  for (const auto& [unit_name, module_name] : model.names) to_unit[module_name] = unit_name;
  for (const auto& name : sources.files[0].names()) {
    const auto b = buffers.find(name);
    if (b != buffers.end()) {
      const SafetensorsTensor t = sources.files[0].tensor(name);
      if (t.shape != b->second.sizes().vec() || detail::scalar_type(t.dtype) != b->second.scalar_type())
        throw checkpoint_error("buffer '" + name + "' in " + sources.what + " is " + shape_text(t.shape) + " " +
                                   std::string(element_name(t.dtype)) + ", the module's " +
                                   detail::sizes_text(b->second.sizes()),
                               "load a file saved from the same module");
      torch::NoGradGuard no_grad;
      at::Tensor src = torch::from_blob(const_cast<std::byte*>(t.bytes.data()), t.shape,
                                        torch::TensorOptions().dtype(detail::scalar_type(t.dtype)));
      b->second.copy_(src.clone());
      sources.ignored.insert(name);
      continue;
    }
    const auto it = options.rename.find(name);
    const auto u = to_unit.find(it == options.rename.end() ? name : it->second);
    sources.parts[u == to_unit.end() ? name : u->second] = {{0, name}};
  }
  return load(sources, options);
}

template <class Trainer, class Loss>
LoadParamsReport load_state_dict(Trainer& trainer, Model<Loss>& model, const std::filesystem::path& path,
                                 const LoadParamsOptions& options = {}) {
  return load_state_dict_with(
      [&](const ParamSources& s, const LoadParamsOptions& o) { return trainer.load_params(s, o); }, model, path,
      options);
}

// A micro-batch from LibTorch tensors (CPU, any dtype dtrain takes), by
// name: {{"x", ids}, {"y", targets}}. One copy into the batch's host tensors.
inline Batch batch(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  Batch b;
  for (const auto& [name, t0] : tensors) {
    const auto type = detail::element_of(t0.scalar_type());
    if (!type)
      throw config_error("batch tensor '" + name + "' holds " + std::string(c10::toString(t0.scalar_type())),
                         "give float, bfloat16, half, int32, int64 or uint8 tensors");
    at::Tensor t = t0.detach().to(c10::kCPU).contiguous();
    HostTensor h{*type, t.sizes().vec(), {}};
    h.bytes.resize(static_cast<std::size_t>(t.nbytes()));
    if (t.nbytes() > 0) std::memcpy(h.bytes.data(), t.data_ptr(), static_cast<std::size_t>(t.nbytes()));
    b.set(name, std::move(h));
  }
  return b;
}

// A torch::data dataset (get(i) -> Example{data, target}) as a dtrain batch
// source: dtrain's distributed sampler draws the indices, gather stacks the
// examples into "x" and "y". Pass it to dtrain::fit like any data set.
template <class Dataset>
class DataSource {
 public:
  explicit DataSource(Dataset dataset) : dataset_(std::move(dataset)) {
    const auto n = dataset_.size();
    if (!n) throw config_error("the torch::data dataset has no size", "give a dataset whose size() is known");
    size_ = static_cast<std::int64_t>(*n);
  }
  std::int64_t size() const { return size_; }
  Batch gather(std::span<const std::int64_t> indices) const {
    std::vector<at::Tensor> xs, ys;
    for (const auto i : indices) {
      auto e = const_cast<Dataset&>(dataset_).get(static_cast<std::size_t>(i));
      xs.push_back(e.data);
      ys.push_back(e.target);
    }
    if (xs.empty()) return batch({{"x", torch::empty({0, 1})}, {"y", torch::empty({0}, torch::kLong)}});
    return batch({{"x", torch::stack(xs)}, {"y", torch::stack(ys)}});
  }

 private:
  Dataset dataset_;
  std::int64_t size_ = 0;
};

}  // namespace dtrain::libtorch
