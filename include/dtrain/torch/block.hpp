#pragma once
// A LibTorch module's blocks as dtrain units, without LibTorch's headers.
//
// dtrain::libtorch::wrap (dtrain/torch/module.hpp, the one header that
// includes <torch/torch.h>) turns the blocks a user names into
//   InputBlock   the first block: reads the batch's "x" as it is (token ids
//                [B, T], images [B, C * H * W]) and writes [rows, width];
//   Block        every later block: [rows, in] -> [rows, out].
// Each holds a BlockRunner, the LibTorch code that runs the block's forward
// with autograd and its backward, behind a virtual interface. This header
// knows nothing of LibTorch, so a translation unit that instantiates the
// Trainer on a GPU (nvcc) includes it without LibTorch's headers; the
// runners are built in the g++ translation unit that wraps the module.
//
// Parameters: the block's parameters are dtrain parameters (ParamSpec, the
// module's names, Init::given from the module's values), so they live in
// dtrain's flat buffers. Each call hands the runner the views the strategy
// gathered (FSDP) or holds (DDP, ZeRO-1); the runner points the module's
// parameters at them (LibTorch tensors over dtrain's memory) before it runs.
//
// Backward: forward records LibTorch's graph and keeps it (with the
// activations LibTorch saves) until the block's backward, as PyTorch does.
// When the block's parameters are no longer at the address the graph saw
// (FSDP freed them after forward and gathered them again elsewhere), the
// runner recomputes the block's forward from its kept input first: the
// graph never reads freed memory, at the cost of one more forward of that
// block. A forward that is not training (evaluate, generate) records no
// graph.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::libtorch {

// Where the compute runs, for the runner's tensors.
enum class device_kind { host, cuda };

// One call of a block, as raw memory: what the runner wraps as LibTorch tensors.
struct BlockCall {
  element_type dtype = element_type::f32;  // the compute dtype of x, y, the parameters
  device_kind device = device_kind::host;
  int device_index = 0;
  int threads = 0;   // the host threads dtrain computes with on this rank (0: leave LibTorch's setting)
  SeqShape shape{};  // the rows' (batch, time)
  // The input: x [rows, in] (a Block), or the batch's tensor as it is (an InputBlock).
  const void* x = nullptr;
  element_type x_type = element_type::f32;
  std::vector<std::int64_t> x_shape{};
  void* y = nullptr;            // [rows, out]
  std::int64_t rows = 0;        // y's rows
  std::vector<void*> params{};  // each parameter's values, in ParamSpec order
  bool training = false;
  // backward only
  const void* dy = nullptr;    // [rows, out]
  void* dx = nullptr;          // [rows, in]; null: not wanted
  std::vector<void*> grads{};  // null for a frozen parameter; else overwritten
};

// The LibTorch side of one block (dtrain/torch/module.hpp implements it).
class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  virtual void forward(const BlockCall& call) = 0;
  virtual void backward(const BlockCall& call) = 0;
  // Forwards since construction that recomputed their graph in backward.
  virtual std::int64_t recomputed() const = 0;
};

// What both block forms share: the declaration and the call's assembly.
class BlockBase {
 public:
  BlockBase() = default;
  BlockBase(std::string name, std::vector<ParamSpec> specs, std::int64_t in, std::int64_t out,
            std::shared_ptr<BlockRunner> runner)
      : name_(std::move(name)), specs_(std::move(specs)), in_(in), out_(out), runner_(std::move(runner)) {}

  std::vector<ParamSpec> params() const { return specs_; }
  std::int64_t out_features(std::int64_t in) const {
    if (in_ >= 0 && in != in_)
      throw config_error("LibTorch block '" + name_ + "' gets rows of width " + std::to_string(in) +
                             " where the module's example input gave it " + std::to_string(in_),
                         "name the blocks in the order the module's forward calls them, each taking the "
                         "previous block's output");
    return out_;
  }
  const std::string& name() const { return name_; }
  BlockRunner& runner() const { return *runner_; }

 protected:
  template <class Dev, class T>
  BlockCall call(Dev& dev, UnitParams<const T> p, MatView<T> y, const UnitContext<T>& ctx) const {
    if constexpr (!Dev::host_accessible) nn::detail::require_gpu_switch("a LibTorch block", "DTRAIN_GPU_LIBTORCH");
    BlockCall c;
    c.dtype = element_type_of<T>();
    c.device = Dev::host_accessible ? device_kind::host : device_kind::cuda;
    if constexpr (requires { dev.device_id(); }) c.device_index = dev.device_id();
    if constexpr (Dev::host_accessible && requires { dev.threads(); }) c.threads = dev.threads();
    c.shape = ctx.shape;
    c.y = y.data;
    c.rows = y.rows;
    c.training = ctx.training;
    c.params.reserve(p.size());
    for (const auto& v : p) c.params.push_back(const_cast<T*>(v.data));
    return c;
  }
  template <class Dev, class T>
  static void grads_into(BlockCall& c, UnitParams<T> grad) {
    c.grads.reserve(grad.size());
    for (const auto& g : grad) c.grads.push_back(g.empty() ? nullptr : static_cast<void*>(g.data));
  }
  // LibTorch and dtrain order their work on different GPU streams: each
  // waits for the other's before it reads.
  template <class Dev>
  static void sync(Dev& dev) {
    if constexpr (!Dev::host_accessible) dev.synchronize();
  }

  std::string name_;
  std::vector<ParamSpec> specs_;
  std::int64_t in_ = -1;  // -1: the input block (reads the batch)
  std::int64_t out_ = 0;
  std::shared_ptr<BlockRunner> runner_;
};

// A block after the first: [rows, in] -> [rows, out].
class Block : public BlockBase {
 public:
  using BlockBase::BlockBase;

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    BlockCall c = call(dev, p, y, ctx);
    c.x = x.data;
    c.x_type = element_type_of<T>();
    c.x_shape = {x.rows, x.cols};
    sync(dev);
    runner_->forward(c);
  }
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    BlockCall c = call(dev, p, MatView<T>{const_cast<T*>(y.data), y.rows, y.cols}, ctx);
    c.training = true;
    c.x = x.data;
    c.x_type = element_type_of<T>();
    c.x_shape = {x.rows, x.cols};
    c.dy = dy.data;
    c.dx = dx.empty() ? nullptr : dx.data;
    grads_into<Dev, T>(c, grad);
    sync(dev);
    runner_->backward(c);
  }
};

// The first block: reads the batch's tensor `input` ("x") in its own shape
// and element type.
class InputBlock : public BlockBase {
 public:
  InputBlock() = default;
  // keeps_time: the block's output keeps the input's time axis (token ids
  // [B, T] -> [B, T, dim]: B * T rows); else one row per sample.
  InputBlock(std::string name, std::vector<ParamSpec> specs, std::int64_t out, std::shared_ptr<BlockRunner> runner,
             bool keeps_time, std::string input = "x")
      : BlockBase(std::move(name), std::move(specs), -1, out, std::move(runner)),
        keeps_time_(keeps_time),
        input_(std::move(input)) {}

  SeqShape out_shape(SeqShape in, SeqShape batch) const { return {batch.batch, keeps_time_ ? in.time : 1}; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, const DeviceBatch& batch, MatView<T> y, const UnitContext<T>& ctx) {
    BlockCall c = call(dev, p, y, ctx);
    input_into(c, batch);
    sync(dev);
    runner_->forward(c);
  }
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, const DeviceBatch& batch, MatView<const T> y,
                MatView<const T> dy, const UnitContext<T>& ctx) {
    BlockCall c = call(dev, p, MatView<T>{const_cast<T*>(y.data), y.rows, y.cols}, ctx);
    c.training = true;
    input_into(c, batch);
    c.dy = dy.data;
    grads_into<Dev, T>(c, grad);
    sync(dev);
    runner_->backward(c);
  }

 private:
  void input_into(BlockCall& c, const DeviceBatch& batch) const {
    const DeviceTensor& t = batch.at(input_);
    c.x = t.device;
    c.x_type = t.type;
    c.x_shape = t.shape;
  }
  bool keeps_time_ = true;
  std::string input_ = "x";
};

// A wrapped LibTorch module as a dtrain model: its first block, the rest,
// and the loss over the last block's output rows.
template <class Loss>
struct Model {
  InputBlock first;
  std::vector<Block> blocks;
  Loss loss{};
  // The module's name of each unit's parameter, in layout order
  // ("<unit>.<param>" -> "layers.0.attn.weight").
  std::vector<std::pair<std::string, std::string>> names{};
  std::shared_ptr<void> module{};  // the torch::nn::Module wrapped
  int rank = 0;                    // this process's rank in the world it was wrapped on

  auto units() { return std::tie(first, blocks); }

  // Forwards whose graph backward recomputed (FSDP), over all blocks.
  std::int64_t recomputed() const {
    std::int64_t n = first.runner().recomputed();
    for (const auto& b : blocks) n += b.runner().recomputed();
    return n;
  }
};

}  // namespace dtrain::libtorch
