#pragma once
// hf::CausalLm against transformers + PyTorch, on any device: tiny random
// models written by make_tiny_lm.py, their first step's loss, logits and
// gradients and their parameters after 20 AdamW steps on one batch, checked
// by training_parity on the host (hf_transformers_test, transformers on the
// CPU) and on the GPU (hf_cuda_test, transformers on the same GPU).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "hf/run_logged.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/trainer.hpp>

namespace dtrain::testing {

struct Expected {
  std::vector<std::int64_t> ids;
  std::vector<float> logits;
};

// A fresh model from make_tiny_lm.py (run by `python`) in a folder of its own.
inline std::filesystem::path make_model(const std::string& python, const std::string& name, const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "models" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cmd = python + " " + DTRAIN_SOURCE_DIR + "/tests/hf/make_tiny_lm.py " + dir.string() + " " + args;
  BOOST_TEST_REQUIRE(run_logged(cmd, dir / "log.txt") == 0,
                     "make_tiny_lm.py " << args << " failed: " << read_text(dir / "log.txt"));
  return dir;
}

inline Expected expected(const std::filesystem::path& dir) {
  const auto f = SafetensorsFile::open(dir / "expected.safetensors");
  return {f.read_i64("ids"), f.read_f32("logits")};
}

// The largest difference, relative to the largest reference value.
inline double worst(const std::vector<float>& got, const std::vector<float>& want) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return err / std::max(scale, 1.0);
}

// transformers' tensor(s) for dtrain's tensor `slot` from the reference file
// ("grad." or "param." + transformers' name): fused parts concatenated,
// Conv1D weights transposed to dtrain's [out, in].
inline std::vector<float> reference_of(const SafetensorsFile& ref, const std::string& kind,
                                       const hf::TransformersNames& names, const ParamSlot& slot) {
  std::vector<float> out;
  for (const auto& t : names.tensors.at(slot.name)) {
    const auto part = ref.read_f32(kind + t);
    out.insert(out.end(), part.begin(), part.end());
  }
  if (names.transposed.contains(slot.name)) {
    const auto rows = static_cast<std::size_t>(slot.spec.shape[0]), cols = out.size() / rows;
    std::vector<float> t(out.size());
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) t[r * cols + c] = out[c * rows + r];
    out = std::move(t);
  }
  return out;
}

// Rows [first, first + rows) of the ids as a batch: x the ids, y the next
// ones (-100 at the end), which is what transformers computes from labels =
// ids. pad > 0: the first sequence is left-padded as transformers_train.py
// pads it (attention_mask 0 on its first pad positions, no target up to its
// first token).
inline Batch rows_batch(const std::vector<std::int64_t>& ids, std::int64_t first, std::int64_t rows, std::int64_t t,
                        std::int64_t pad) {
  std::vector<std::int64_t> x(ids.begin() + first * t, ids.begin() + (first + rows) * t), y(x.size()),
      mask(x.size(), 1);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < t; ++i) {
      const bool padded = first + r == 0 && i < pad, no_target = first + r == 0 && i + 1 <= pad;
      const auto at = static_cast<std::size_t>(r * t + i);
      mask[at] = padded ? 0 : 1;
      y[at] = i + 1 < t && !no_target ? x[at + 1] : -100;
    }
  Batch b;
  b.set("x", HostTensor::of(x, {rows, t}));
  b.set("y", HostTensor::of(y, {rows, t}));
  if (pad > 0) b.set("attention_mask", HostTensor::of(mask, {rows, t}));
  return b;
}

// The owned gradient on the host, whichever device holds it.
template <class Trainer>
std::vector<float> owned_gradient(Trainer& trainer) {
  const OwnedFlat<float> owned = trainer.strategy().owned();
  std::vector<float> g(owned.size);
  if (owned.on_host || std::is_same_v<typename Trainer::device_type, Host>)
    std::copy_n(owned.grad, owned.size, g.data());
  else
    trainer.device().copy_to_host(g.data(), owned.grad, owned.size);
  return g;
}

// Where training parity is checked, and how closely.
struct ParityRun {
  std::string python;        // the python with torch and transformers
  std::string torch_device;  // "cpu" or "cuda": where transformers trains
  double logits = 1e-5;      // relative to the largest reference logit
  double gradient = 1e-5;    // relative to each tensor's largest reference value
  double parameters = 3e-5;  // relative to max(1, |reference|), after 20 AdamW steps
};

// The first step's loss and every gradient (DDP, one rank), and the
// parameters after 20 AdamW steps at 1 and 2 ranks under DDP and fsdp-full,
// against transformers + torch.optim.AdamW on the same batch. Dev = Cuda
// runs its two ranks on the GPU(s) over the host transport.
//
// With `lora_targets` (comma-separated), PEFT (peft_adapter.py) makes a LoRA
// adapter of rank 4 with A and B random on those targets first, and both
// sides train it on the frozen base (PEFT with torch's AdamW over the
// adapters): the gradients and parameters compared are the adapters'.
template <class Dev>
void training_parity(const ParityRun& how, const std::string& name, const std::string& args, std::int64_t pad = 0,
                     const std::string& lora_targets = "") {
  namespace fs = std::filesystem;
  const fs::path dir = make_model(how.python, name, args);
  const Expected e = expected(dir);
  const fs::path ref_file = dir / "train_reference.safetensors", adapter = dir / "peft_adapter";
  if (!lora_targets.empty())
    BOOST_TEST_REQUIRE(
        run_logged(how.python + " " + DTRAIN_SOURCE_DIR + "/tests/hf/peft_adapter.py make " + (dir / "model").string() +
                       " " + adapter.string() + " " + (dir / "expected.safetensors").string() + " " +
                       (dir / "peft_logits.safetensors").string() + " " + lora_targets + " 4 8",
                   dir / "peft_log.txt") == 0,
        read_text(dir / "peft_log.txt"));
  BOOST_TEST_REQUIRE(run_logged(how.python + " " + DTRAIN_SOURCE_DIR + "/tests/hf/transformers_train.py " +
                                    (dir / "model").string() + " " + (dir / "expected.safetensors").string() + " " +
                                    ref_file.string() + " 20 " + std::to_string(pad) + " " + how.torch_device +
                                    (lora_targets.empty() ? "" : " " + adapter.string()),
                                dir / "train_log.txt") == 0,
                     read_text(dir / "train_log.txt"));
  const auto ref = SafetensorsFile::open(ref_file);
  const hf::LmConfig config = hf::read_config(dir / "model");
  const hf::LoraConfig lora = lora_targets.empty() ? hf::LoraConfig{} : hf::read_adapter_config(adapter);
  hf::TransformersNames names = hf::transformers_names(config);
  if (lora.on()) names.tensors = hf::peft_names(config, hf::plan_lora(config, lora));
  const std::int64_t t = static_cast<std::int64_t>(e.ids.size()) / 2;
  const AdamW adamw{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};

  auto run = [&]<class Kind>(std::type_identity<Kind>, int ranks) {
    double loss = 0, grad_err = 0, param_err = 0, logit_err = 0;
    std::string grad_at, param_at;
    run_ranks(
        ranks,
        [&](World& w) {
          hf::CausalLm model(config, lora);
          Trainer<hf::CausalLm, Device<Dev>, Strategy<Kind>> trainer(w, model, adamw);
          hf::load_pretrained(trainer, dir / "model", config);
          if (lora.on()) hf::load_adapter(trainer, adapter, model);
          const Batch b = rows_batch(e.ids, ranks == 1 ? 0 : w.rank(), ranks == 1 ? 2 : 1, t, pad);
          if (ranks == 1) {  // the logits of the tokens (padding positions compute nothing anyone reads)
            const std::vector<float> got = trainer.predict(b), want = ref.read_f32("logits");
            const auto first = static_cast<std::ptrdiff_t>(pad * config.vocab_size);
            logit_err = worst({got.begin() + first, got.end()}, {want.begin() + first, want.end()});
          }
          for (int s = 0; s < 20; ++s) {
            const StepStats st = trainer.step(std::span(&b, 1));
            if (s != 0) continue;
            loss = st.loss;
            if (ranks != 1) continue;
            // One rank, DDP: the owned gradient is the whole flat, in layout order.
            const std::vector<float> grad = owned_gradient(trainer);
            for (const auto& unit : trainer.layout().units())
              for (const auto& slot : unit.params) {
                if (!slot.spec.trainable) continue;  // frozen: no gradient (the base under LoRA)
                const auto want = reference_of(ref, "grad.", names, slot);
                double err = 0, scale = 0;
                for (std::size_t i = 0; i < want.size(); ++i) {
                  err = std::max(err, std::abs(static_cast<double>(grad[slot.offset + i]) - want[i]));
                  scale = std::max(scale, std::abs(static_cast<double>(want[i])));
                }
                if (err / std::max(scale, 1e-30) > grad_err)
                  grad_err = err / std::max(scale, 1e-30), grad_at = slot.name;
              }
          }
          const auto params = trainer.parameters();
          if (w.rank() != 0) return;
          for (const auto& unit : trainer.layout().units())
            for (const auto& slot : unit.params) {
              if (!slot.spec.trainable) continue;  // frozen: as loaded (lora_test checks it stays)
              const auto want = reference_of(ref, "param.", names, slot);
              const auto& got = params.at(slot.name);
              // GPT-2's key bias adds the same q.b_k to every score of a query,
              // which softmax ignores: its gradient is exactly zero, computed as
              // rounding noise (checked below) that Adam normalises into
              // lr-sized steps of either sign, in transformers as in dtrain.
              const bool key_bias = config.gpt2() && slot.name.ends_with("attn.qkv.bias");
              const auto d = static_cast<std::size_t>(config.hidden_size);
              for (std::size_t i = 0; i < want.size(); ++i) {
                if (key_bias && i >= d && i < 2 * d) continue;
                const double diff = std::abs(static_cast<double>(got[i]) - want[i]) /
                                    std::max(1.0, std::abs(static_cast<double>(want[i])));
                if (diff > param_err) param_err = diff, param_at = slot.name + "[" + std::to_string(i) + "]";
              }
            }
        },
        CommOptions{.gpu = gpu_transport::host});
    if (config.gpt2() && !lora.on())
      for (std::int64_t l = 0; l < config.num_hidden_layers; ++l) {
        const auto g = ref.read_f32("grad.transformer.h." + std::to_string(l) + ".attn.c_attn.bias");
        for (auto i = config.hidden_size; i < 2 * config.hidden_size; ++i)
          BOOST_TEST(std::abs(g[static_cast<std::size_t>(i)]) <= 1e-6,
                     "the key bias gradient is noise: " << g[static_cast<std::size_t>(i)]);
      }
    const double ref_loss = ref.read_f32("loss")[0];
    std::printf("%s %s x%d on %s: loss %.8f vs %.8f (diff %.1e)", name.c_str(), std::string(Kind::name).c_str(), ranks,
                std::string(Dev::name).c_str(), loss, ref_loss, std::abs(loss - ref_loss));
    if (ranks == 1) std::printf(", logits %.1e", logit_err);
    if (ranks == 1 && std::is_same_v<Kind, DDP>) std::printf(", worst gradient %.1e (%s)", grad_err, grad_at.c_str());
    std::printf(", parameters after 20 AdamW steps %.1e (%s)\n", param_err, param_at.c_str());
    BOOST_TEST(std::abs(loss - ref_loss) <= 1e-6 * std::max(1.0, std::abs(ref_loss)), name << " loss");
    if (ranks == 1) BOOST_TEST(logit_err <= how.logits, name << " logits");
    if (ranks == 1 && std::is_same_v<Kind, DDP>)
      BOOST_TEST(grad_err <= how.gradient, name << " gradient of " << grad_at);
    BOOST_TEST(param_err <= how.parameters,
               name << " " << Kind::name << " x" << ranks << " parameters at " << param_at);
  };
  run(std::type_identity<DDP>{}, 1);
  run(std::type_identity<DDP>{}, 2);
  run(std::type_identity<FSDP<FullShard>>{}, 1);
  run(std::type_identity<FSDP<FullShard>>{}, 2);
}

}  // namespace dtrain::testing
