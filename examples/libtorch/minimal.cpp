// libtorch_minimal: a whole LibTorch training program on dtrain, the lines
// that differ from a plain LibTorch program marked (docs/libtorch.md).
//
//   dtrain-run --nproc-per-node 2 libtorch_minimal

#include <torch/torch.h>

#include <cstdio>
#include <exception>

// [snippet:libtorch_minimal]
#include <dtrain/torch/module.hpp>  // (1) dtrain's LibTorch layer
#include <dtrain/trainer.hpp>

// A model as LibTorch users write it.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : body(register_module("body", torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::GELU(),
                                                           torch::nn::Linear(64, 64), torch::nn::GELU()))),
        head(register_module("head", torch::nn::Linear(64, 4))) {}
  torch::Tensor forward(torch::Tensor x) { return head(body->forward(x)); }
  torch::nn::Sequential body;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

int main() try {
  dtrain::World world = dtrain::init();  // the job dtrain-run (or torchrun, srun) launched
  torch::manual_seed(0);
  Net net;
  // (2) the module's blocks become dtrain units: here body's four layers and head
  auto model = dtrain::libtorch::wrap(world, net, {net->body, net->head}, torch::zeros({1, 16}));
  // (3) a Trainer instead of a torch::optim optimizer: FSDP shards the blocks over the ranks
  dtrain::Trainer<decltype(model), dtrain::Device<dtrain::Host>, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>>
      trainer(world, model, dtrain::AdamW{.lr = 3e-3f});
  const auto teacher = torch::randn({16, 4});  // the task: the class is argmax(x teacher)
  torch::manual_seed(1 + world.rank());        // each rank its own samples
  for (int step = 1; step <= 200; ++step) {
    const auto x = torch::randn({32, 16});
    const auto y = x.matmul(teacher).argmax(1);
    const dtrain::Batch batch = dtrain::libtorch::batch({{"x", x}, {"y", y}});
    const auto stats = trainer.step(std::span(&batch, 1));
    if (world.rank() == 0 && step % 50 == 0) std::printf("step %d loss %.4f\n", step, stats.loss);
  }
  dtrain::libtorch::copy_to_module(trainer, model);                      // net holds the trained weights again
  dtrain::libtorch::save_state_dict(trainer, model, "net.safetensors");  // Python: load_state_dict(load_file(...))
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return dtrain::exit_code(e);  // 2 for a configuration error
}
// [/snippet:libtorch_minimal]
