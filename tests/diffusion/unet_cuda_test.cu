// The diffusion models on dtrain::Cuda against dtrain::Host: a tiny
// SD-shaped UNet (1x1 convolution projections, cross-attention in the first
// block), the same with LoRA adapters on both attentions, an SDXL-shaped one
// (linear projections, two transformer layers, text_time), with the GPU
// paths switched on (DTRAIN_GPU_VISION=on, DTRAIN_GPU_ATTENTION=on): the
// prediction and the parameters after two SGD steps (lr 0.1) within 1e-4 of
// the host's, relative to the largest element. Without the switch the UNet
// units refuse the GPU, naming it. What a GPU run must pass before the
// switches become the default (docs/gpu.md). Needs a GPU; exits 77 without
// one, and compiles under nvcc everywhere.
#include "support/gpu_main.hpp"
// gpu_main.hpp first: it sets Boost.Test up for its own main() before anything includes Boost.Test.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "support/ranks.hpp"

#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/diffusion/unet.hpp"
#include "dtrain/trainer.hpp"

namespace {

using namespace dtrain;
using namespace dtrain::testing;

models::UNetConfig tiny(bool sdxl) {
  models::UNetConfig c;
  c.block_out_channels = {16, 32};
  c.layers_per_block = {1};
  c.norm_num_groups = 8;
  c.cross_attention_dim = 24;
  c.sample_height = c.sample_width = 8;
  c.context_length = 5;
  if (!sdxl) {
    c.down_block_types = {"CrossAttnDownBlock2D", "DownBlock2D"};
    c.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D"};
    c.attention_heads = {2};
    return c;
  }
  c.down_block_types = {"DownBlock2D", "CrossAttnDownBlock2D"};
  c.up_block_types = {"CrossAttnUpBlock2D", "UpBlock2D"};
  c.attention_heads = {2, 4};
  c.transformer_layers_per_block = {1, 2};
  c.use_linear_projection = true;
  c.addition_embed_type = "text_time";
  c.addition_time_embed_dim = 8;
  c.projection_class_embeddings_input_dim = 16 + 6 * 8;
  return c;
}

std::vector<float> values(std::size_t n, std::size_t salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + salt * 11) % 101) / 50.f - 1.f;
  return v;
}

Batch batch(const models::UNetConfig& c) {
  const std::int64_t b = 2, e = 4 * 8 * 8;
  Batch out;
  out.set("x", HostTensor::of(values(b * e, 1), {b, e}));
  out.set("y", HostTensor::of(values(b * e, 2), {b, e}));
  out.set("timesteps", HostTensor::of(std::vector<float>{37.f, 901.f}, {b}));
  out.set("encoder_hidden_states", HostTensor::of(values(b * 5 * 24, 3), {b, 5, 24}));
  if (!c.addition_embed_type.empty()) {
    out.set("pooled", HostTensor::of(values(b * 16, 4), {b, 16}));
    out.set("time_ids", HostTensor::of(std::vector<float>{64, 48, 0, 8, 64, 48, 32, 32, 4, 0, 32, 32}, {b, 6}));
  }
  return out;
}

double worst(const std::vector<float>& a, const std::vector<float>& c) {
  double d = 0, m = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - c[i]));
    m = std::max(m, std::abs(double(a[i])));
  }
  return d / m;
}

void gpu_matches_host(const std::string& name, const models::UNetConfig& c, const hf::LoraConfig& lora = {}) {
  ::setenv("DTRAIN_GPU_VISION", "on", 1);
  ::setenv("DTRAIN_GPU_ATTENTION", "on", 1);
  const Batch b = batch(c);
  std::vector<float> pred[2];
  std::map<std::string, std::vector<float>> after[2];
  run_ranks(1, [&](World& w) {
    models::UNet2DCondition model(c, lora);
    Trainer<models::UNet2DCondition, Device<Host>> host(w, model, SGD{.lr = 0.1f}, {.seed = 3});
    const std::string start = std::string(DTRAIN_TEST_BINARY_DIR) + "/unet_cuda_start.safetensors";
    host.save_params(start);
    pred[0] = host.predict(b);
    for (int s = 0; s < 2; ++s) host.step(std::vector<Batch>{b});  // the second with LoRA's B moved
    after[0] = host.parameters();
    models::UNet2DCondition again(c, lora);
    Trainer<models::UNet2DCondition, Device<Cuda>> gpu(w, again, SGD{.lr = 0.1f});
    gpu.load_params(start);  // the host's initial values, LoRA's B (zeros) too
    pred[1] = gpu.predict(b);
    for (int s = 0; s < 2; ++s) gpu.step(std::vector<Batch>{b});
    after[1] = gpu.parameters();
  });
  double params = 0;
  for (const auto& [n, v] : after[0]) params = std::max(params, worst(v, after[1].at(n)));
  std::printf("%s on the GPU vs the host: prediction %.3e, parameters after two steps %.3e (relative)\n", name.c_str(),
              worst(pred[0], pred[1]), params);
  BOOST_TEST(worst(pred[0], pred[1]) <= 1e-4);
  BOOST_TEST(params <= 1e-4);
}

}  // namespace

BOOST_AUTO_TEST_CASE(unet_units_are_off_without_the_switch) {
  ::unsetenv("DTRAIN_GPU_VISION");
  models::UNet2DCondition model(tiny(false));
  const Batch b = batch(tiny(false));
  run_ranks(1, [&](World& w) {
    Trainer<models::UNet2DCondition, Device<Cuda>> gpu(w, model, SGD{.lr = 0.1f});
    BOOST_CHECK_EXCEPTION(gpu.predict(b), config_error, [](const config_error& e) {
      return std::string(e.what()).find("DTRAIN_GPU_VISION=on") != std::string::npos;
    });
  });
}

BOOST_AUTO_TEST_CASE(sd_unet_on_the_gpu_matches_the_host) { gpu_matches_host("SD-shaped UNet", tiny(false)); }

BOOST_AUTO_TEST_CASE(sd_unet_with_lora_on_the_gpu_matches_the_host) {
  gpu_matches_host("SD-shaped UNet + LoRA", tiny(false),
                   {.r = 2, .alpha = 3.f, .targets = {"to_q", "to_k", "to_v", "to_out.0"}});
}

BOOST_AUTO_TEST_CASE(sdxl_unet_on_the_gpu_matches_the_host) { gpu_matches_host("SDXL-shaped UNet", tiny(true)); }
