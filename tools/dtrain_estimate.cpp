// dtrain-estimate: how much memory one rank needs, by category, for a model
// under every strategy, before anything is launched or allocated. The
// numbers come from estimate_memory (<dtrain/train/estimate.hpp>), which
// tests/tools/estimate_test.cpp checks against the Trainer's measurement.
//
//   dtrain-estimate --params 7B --precision bf16 --world 8
//   dtrain-estimate --config examples/configs/ddp_host.yaml precision=bf16 --world 4 --json
//   dtrain-estimate --hf-config Meta-Llama-3-8B/config.json --precision bf16 --world 8
//   dtrain-estimate --hf-config llava-1.5-7b-hf/config.json --precision bf16 --world 1,2,4 --strategy ddp,fsdp-full
//
// Exit status: 0 printed, 2 bad input (one line naming the problem and the fix).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include <dtrain/diffusion/pixart.hpp>
#include <dtrain/diffusion/unet.hpp>
#include <dtrain/hf/config.hpp>
#include <dtrain/hf/llava.hpp>
#include <dtrain/hf/model.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/lerobot/act.hpp>
#include <dtrain/models/causal_lm.hpp>  // the examples' models and their keys' defaults
#include <dtrain/models/gpt.hpp>
#include <dtrain/models/llava.hpp>
#include <dtrain/models/mlp.hpp>
#include <dtrain/models/policy.hpp>
#include <dtrain/train/estimate.hpp>

namespace {

using namespace dtrain;

constexpr std::string_view usage = R"(usage: dtrain-estimate --params N [options]
       dtrain-estimate --hf-config config.json [options]
       dtrain-estimate --config FILE.yaml [--example mlp|gpt|policy|lm|vlm] [key=value ...] --world N [options]

Prints one rank's memory by category (MiB) for a model trained with dtrain,
one row per strategy, without allocating or launching anything.

the model (one of):
  --params N                 N parameters (suffix K, M or B: 125M, 7B) in one unit
  --hf-config FILE           a transformers config.json (gpt2, llama, mistral, qwen2,
                             qwen3, gemma, gemma3_text):
                             the units of hf::CausalLm built from it (embedding,
                             each layer, final norm, head); training flags as
                             with --params
                             A LLaVA config (model_type llava): hf::Llava
                             built once per train mode, one row per mode,
                             activations included (see LLaVA below)
                             A LeRobot ACT policy's config.json (or its
                             directory; "type": "act"): models::Act,
                             activations included for --batch-size samples
                             (default 8), --activation-checkpointing
                             A diffusers UNet2DConditionModel or
                             PixArtTransformer2DModel config.json (or its
                             folder, or a pipeline folder): the model at the
                             config's sample_size, activations included for
                             --batch-size records (default 1) with a text of
                             --seq-len tokens (default 77; PixArt 300),
                             --activation-checkpointing; UNet LoRA with
                             --lora-r and --lora-targets (to_q,to_k,...)
  --lora-r R, --lora-targets T
                             with --hf-config: LoRA adapters of rank R on the
                             linear layers T names (PEFT's target_modules, e.g.
                             q_proj,v_proj or all-linear), the rest frozen
                             (LLaVA: on its language model)
  --units U                  split the trainable ones into U equal units instead,
                             e.g. a transformer's layers (FSDP gathers one unit
                             at a time, so this sets the gathered column)
  --trainable-fraction F     the trainable share of them, 0..1 (default 1); the
                             frozen rest is a unit of its own
  --config FILE.yaml         an example's config; key=value arguments override its
                             keys as for the example. Read: precision,
                             reduce_dtype, accumulate, batch_size, optimizer,
                             momentum, strategy (its row is marked *),
                             shard_group, prefetch, activation_checkpointing,
                             and the model's keys (train_mlp: hidden, features,
                             classes; train_gpt: n_layer, n_head, n_embd,
                             block_size, data, corpus_bytes, data_seed;
                             train_policy: hidden, horizon, image, image_size,
                             policy, cameras, camera_size and the ACT keys
                             (dim_model, n_heads, dim_feedforward, ...);
                             train_lm: model or config, block_size, packing,
                             lora_r, lora_alpha, lora_dropout, lora_rslora,
                             lora_targets, lora_modules_to_save, adapter;
                             train_vlm: model or config, train and the
                             lora_ keys, with --seq-len T);
                             every other key is ignored. Activations are the
                             Trainer's buffers for one micro-batch.
  --example mlp|gpt|policy|lm|vlm
                             which example's config it is (default mlp)

training (with --params; with --config use the config's keys):
  --precision fp32|bf16|fp16 compute dtype (default fp32)
  --reduce-dtype fp32|same   dtype gradients are reduced in (default fp32)
  --optimizer adamw|sgd      AdamW keeps 2 fp32 states per parameter, SGD 1 with
                             momentum, 0 without (default adamw)
  --momentum M               SGD momentum (default 0.9)
  --accumulate A             micro-batches per optimizer step (default 1)
  --prefetch P               FSDP/ZeRO1 units gathered ahead (default 1)

LLaVA (with a LLaVA --hf-config):
  --train PARTS              the parts that train, the others frozen: a comma
                             list of projector, vision, language or all; one
                             mode per --train, repeatable (default: three
                             modes, projector; projector,vision; all)
  --batch-size B             sequences (one image each) per micro-batch (default 1)
  --seq-len T                text positions per sequence, the image's feature
                             tokens included (default: the features + 64);
                             also with --config of --example vlm
  --activation-checkpointing every unit's activations recomputed in backward

both:
  --world N[,N...]           ranks (default 1 with --params; required with
                             --config); a list gives rows for each
  --shard-group G            fsdp-hybrid: ranks per shard group, a divisor of the
                             world (default: the whole world, one node)
  --strategy NAME|all        ddp, fsdp-full, fsdp-grad-op, fsdp-no-shard,
                             fsdp-hybrid, zero1, a comma list of them, or all
                             (default)
  --offload none|optimizer|params|all
                             model states in host memory (default none): the
                             table adds an offload column and the host bytes;
                             all gives every combination a strategy supports
  --state-on-disk            with an offload: the optimizer state in files
                             (offload=nvme:DIR); the JSON's "disk" holds it
  --activations-bytes B      activation bytes per rank (default 0 with --params
                             and a causal LM, the model's with --config and LLaVA)
  --json                     the same as JSON, in bytes
  -h, --help                 this text

Columns: params (what persists: compute copy, or the fp32 weights when compute
is fp32), grads (gradients and their fp32 accumulator or shard), optimizer
state, master (fp32 weights beside a 16-bit copy), gathered (FSDP's transient
unit buffers, an upper bound: see docs/launcher.md), activations,
total per rank (also counts a few bytes of scalar scratch). Model states are
exact, including the padding of every unit to a multiple of the shard count.

exit status: 0 printed, 2 bad input
)";

// Bad input: printed as one line, exit status 2.
struct usage_error {
  std::string problem, fix;
};

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

// LLaVA's train modes: one model each, the rest of the inputs shared.
struct Mode {
  std::string train;  // parse_llava_train's list, as given
  std::vector<UnitNumel> units;
  std::size_t trainable = 0, activations = 0;
};

// Everything the command line and the config decide.
struct Inputs {
  std::string source;  // --config: the file and the MLP's shape
  std::vector<UnitNumel> units;
  std::size_t parameters = 0, trainable = 0;
  std::string precision = "fp32", reduce_dtype = "fp32", optimizer = "adamw";
  double momentum = 0.9;
  int accumulate = 1, prefetch = 1, world = 1, shard_group = 0;
  std::vector<int> worlds;                  // --world's list (world: the one estimated)
  std::optional<int> shard_group_flag;      // --shard-group (else each world is one group)
  std::vector<Mode> modes;                  // LLaVA: one per --train (units etc.: the first's)
  std::optional<std::int64_t> micro_batch;  // rows, when activations were worked out
  std::size_t activations = 0;
  std::string strategy = "all";
  std::string offload = "none";               // none | optimizer | params | all
  bool state_on_disk = false;                 // --state-on-disk
  std::string config_strategy;                // --config: the config's strategy= (marked in the table)
  bool checkpointing = false;                 // --config: activation_checkpointing=true
  std::size_t checkpoint_every = 1;           // --config: checkpoint_every=K
  std::vector<std::size_t> checkpoint_units;  // --config: checkpoint_units=A,B
  std::size_t checkpoint_budget = 0;          // --config: checkpoint_budget_mib=M, in bytes
  bool json = false;
};

// ---- parsing ----------------------------------------------------------------

// A number from min to max (an integer when N is one); `what` names it.
template <class N>
N parse_number(std::string_view what, std::string_view text, double min, double max) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(std::string(text), &used);
  } catch (const std::exception&) {
  }
  constexpr bool integral = std::is_integral_v<N>;
  if (text.empty() || used != text.size() || !(v >= min && v <= max) || (integral && v != std::floor(v)))
    throw usage_error{std::string(what) + " " + in_quotes(text) + " is not valid",
                      std::string("give ") + (integral ? "an integer" : "a number") + " from " + number_text(min) +
                          (max < 1e15 ? " to " + number_text(max) : std::string(" up"))};
  return static_cast<N>(v);
}

// A parameter count: digits with an optional K, M or B (10^3, 10^6, 10^9).
std::size_t parse_count(std::string_view text) {
  double scale = 1;
  std::string_view digits = text;
  if (!text.empty()) {
    const char s = text.back();
    scale = s == 'K' || s == 'k'                           ? 1e3
            : s == 'M' || s == 'm'                         ? 1e6
            : s == 'B' || s == 'b' || s == 'G' || s == 'g' ? 1e9
                                                           : 1;
    if (scale != 1) digits.remove_suffix(1);
  }
  const double n = parse_number<double>("--params", digits, 1, 1e18) * scale;
  if (n != std::floor(n))
    throw usage_error{"--params " + in_quotes(text) + " is not a whole number", "e.g. --params 1.5B"};
  return static_cast<std::size_t>(n);
}

constexpr std::array<std::string_view, 3> precisions = {"fp32", "bf16", "fp16"};
constexpr std::array<std::string_view, 4> offloads = {"none", "optimizer", "params", "all"};
constexpr std::array<std::string_view, 2> reduce_dtypes = {"fp32", "same"};
constexpr std::array<std::string_view, 2> optimizers = {"adamw", "sgd"};
constexpr std::array<std::string_view, 5> examples_known = {"mlp", "gpt", "policy", "lm", "vlm"};
// Flags that --config takes from the config's keys instead.
constexpr std::array<std::string_view, 6> training_flags = {"--precision", "--reduce-dtype", "--optimizer",
                                                            "--momentum",  "--accumulate",   "--prefetch"};

// `text` if it is one of `choices`.
template <class Choices>
std::string one_of(std::string_view what, std::string_view text, const Choices& choices) {
  std::string list;
  for (auto c : choices) {
    if (text == c) return std::string(text);
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  throw usage_error{std::string(what) + " " + in_quotes(text) + " is unknown", "use one of " + list};
}

std::size_t dtype_bytes(const std::string& precision) { return precision == "fp32" ? 4 : 2; }

// The dtype gradients are reduced in.
std::string reduce_name(const Inputs& in) { return in.reduce_dtype == "same" ? in.precision : "fp32"; }

std::size_t optimizer_states(const Inputs& in) {
  if (in.optimizer == "adamw") return 2;
  return in.momentum != 0 ? 1 : 0;
}

// A YAML sequence's items, or a scalar's comma-separated ones (none for an
// empty scalar).
std::vector<std::string> list_items(const YAML::Node& v) {
  std::vector<std::string> out;
  if (v.IsSequence()) {
    for (const auto& item : v) out.push_back(item.Scalar());
    return out;
  }
  const std::string list = v.Scalar();
  for (std::size_t at = 0; !list.empty() && at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// The keys that change memory (every example's, then the model's own); the
// model's shape goes to `c`.
template <class Config>
void set_key(Config& c, const std::string& key, const YAML::Node& v) {
  const auto as = [&]<class V>(std::type_identity<V>) {
    try {
      return v.as<V>();
    } catch (const YAML::Exception&) {
      throw usage_error{"config key '" + key + "' has a value of the wrong type",
                        "see the example's --help or examples/configs/ for its form"};
    }
  };
  const auto text = [&] { return as(std::type_identity<std::string>{}); };
  const auto integer = [&] { return as(std::type_identity<std::int64_t>{}); };
  const auto widths = [&](std::int64_t least = 1) {
    if (!v.IsSequence()) text();  // a scalar, or the key's type error
    std::vector<std::int64_t> out;
    for (const auto& w : list_items(v)) out.push_back(parse_number<std::int64_t>(key, w, least, 1e12));
    return out;
  };
  if (key == "precision")
    c.precision = text();
  else if (key == "reduce_dtype")
    c.reduce_dtype = text();
  else if (key == "accumulate")
    c.accumulate = static_cast<int>(integer());
  else if (key == "batch_size")
    c.batch_size = integer();
  else if (key == "optimizer")
    c.optimizer = text();
  else if (key == "momentum")
    c.momentum = static_cast<float>(as(std::type_identity<double>{}));
  else if (key == "strategy")
    c.strategy = text();
  else if (key == "shard_group")
    c.shard_group = static_cast<int>(integer());
  else if (key == "prefetch")
    c.prefetch = static_cast<int>(integer());
  else if (key == "activation_checkpointing")
    c.activation_checkpointing = as(std::type_identity<bool>{});
  else if (key == "checkpoint_every")
    c.checkpoint_every = integer();
  else if (key == "checkpoint_units")
    c.checkpoint_units = widths(0);
  else if (key == "checkpoint_budget_mib")
    c.checkpoint_budget_mib = as(std::type_identity<double>{});
  else if constexpr (std::is_same_v<Config, models::MlpConfig>) {
    if (key == "hidden")
      c.hidden = widths();
    else if (key == "features")
      c.features = integer();
    else if (key == "classes")
      c.classes = integer();
  } else if constexpr (std::is_same_v<Config, models::GptConfig>) {
    if (key == "n_layer")
      c.n_layer = integer();
    else if (key == "n_head")
      c.n_head = integer();
    else if (key == "n_embd")
      c.n_embd = integer();
    else if (key == "block_size")
      c.block_size = integer();
    else if (key == "data")
      c.data = text();
    else if (key == "corpus_bytes")
      c.corpus_bytes = integer();
    else if (key == "data_seed")
      c.data_seed = as(std::type_identity<std::uint64_t>{});
  } else if constexpr (std::is_same_v<Config, models::CausalLmConfig> ||
                       std::is_same_v<Config, models::LlavaRunConfig>) {
    if (key == "model")
      c.model = text();
    else if (key == "config")
      c.config = text();
    else if (key == "lora_r")
      c.lora_r = integer();
    else if (key == "lora_alpha")
      c.lora_alpha = static_cast<float>(as(std::type_identity<double>{}));
    else if (key == "lora_dropout")
      c.lora_dropout = static_cast<float>(as(std::type_identity<double>{}));
    else if (key == "lora_rslora")
      c.lora_rslora = as(std::type_identity<bool>{});
    else if (key == "lora_targets") {
      if (!v.IsSequence()) text();  // a scalar, or the key's type error
      c.lora_targets = list_items(v);
    } else if (key == "lora_modules_to_save") {
      if (!v.IsSequence()) text();
      c.lora_modules_to_save = list_items(v);
    } else if constexpr (std::is_same_v<Config, models::LlavaRunConfig>) {
      if (key == "train") c.train = text();
    } else {
      if (key == "block_size")
        c.block_size = integer();
      else if (key == "packing")
        c.packing = as(std::type_identity<bool>{});
      else if (key == "adapter")
        c.adapter = text();
    }
  } else {
    const auto real = [&] { return static_cast<float>(as(std::type_identity<double>{})); };
    const auto flag = [&] { return as(std::type_identity<bool>{}); };
    if (key == "hidden")
      c.hidden = widths();
    else if (key == "policy")
      c.policy = text();
    else if (key == "cameras")
      c.cameras = integer();
    else if (key == "camera_size")
      c.camera_size = integer();
    else if (key == "dim_model")
      c.act.dim_model = integer();
    else if (key == "n_heads")
      c.act.n_heads = integer();
    else if (key == "dim_feedforward")
      c.act.dim_feedforward = integer();
    else if (key == "n_encoder_layers")
      c.act.n_encoder_layers = integer();
    else if (key == "n_decoder_layers")
      c.act.n_decoder_layers = integer();
    else if (key == "n_vae_encoder_layers")
      c.act.n_vae_encoder_layers = integer();
    else if (key == "latent_dim")
      c.act.latent_dim = integer();
    else if (key == "use_vae")
      c.act.use_vae = flag();
    else if (key == "pre_norm")
      c.act.pre_norm = flag();
    else if (key == "dropout")
      c.act.dropout = real();
    else if (key == "kl_weight")
      c.act.kl_weight = real();
    else if (key == "feedforward_activation")
      c.act.feedforward_activation = text();
    else if (key == "horizon")
      c.horizon = integer();
    else if (key == "image")
      c.image = as(std::type_identity<bool>{});
    else if (key == "image_size")
      c.image_size = integer();
  }
}

template <class Config>
Config read_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (!std::filesystem::is_regular_file(path))
    throw usage_error{"config file " + in_quotes(path) + " does not exist",
                      "pass the path of an example's YAML config"};
  Config c;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw usage_error{"cannot read config " + in_quotes(path) + ": " + e.what(), "check the YAML syntax"};
  }
  if (!root.IsMap() && !root.IsNull())
    throw usage_error{"config " + in_quotes(path) + " is not a map of keys", "write one key: value per line"};
  for (const auto& kv : root) set_key(c, kv.first.as<std::string>(), kv.second);
  for (const auto& kv : overrides) {
    const auto eq = kv.find('=');
    try {
      set_key(c, kv.substr(0, eq), YAML::Load(kv.substr(eq + 1)));
    } catch (const YAML::Exception& e) {
      throw usage_error{"cannot read " + in_quotes(kv) + ": " + e.what(), "write key=value, e.g. hidden=[256,256]"};
    }
  }
  return c;
}

// A JSON file's object, or nullopt when the file does not read, is not
// JSON, is nested too deep (detail::parse_json) or is not an object: the
// model kinds below look at a config to choose a reader, and a file none of
// them takes goes to the causal LM's reader, which names its problem.
std::optional<nlohmann::ordered_json> json_object_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    auto j = dtrain::detail::parse_json(in, [](const std::string& problem) { return std::runtime_error(problem); });
    if (j.is_object()) return j;
  } catch (const std::runtime_error&) {
  }
  return std::nullopt;
}

// A LeRobot ACT policy's config.json (or its directory): "type": "act".
bool lerobot_act_json(std::filesystem::path path) {
  if (std::filesystem::is_directory(path)) path /= "config.json";
  const auto j = json_object_file(path);
  return j && j->contains("type") && j->at("type") == "act";
}

// What an ACT batch holds besides its images: the state, the action chunk
// and its padding flags.
std::size_t act_batch_bytes(const models::ActConfig& a, std::int64_t batch) {
  return static_cast<std::size_t>(batch * (a.state_dim + a.chunk_size * a.action_dim)) * sizeof(float) +
         static_cast<std::size_t>(batch * a.chunk_size) * sizeof(std::int64_t);
}

std::string act_text(const models::ActConfig& a) {
  return std::to_string(a.cameras.size()) + " camera(s) " + std::to_string(a.image_height) + "x" +
         std::to_string(a.image_width) + ", dim_model " + std::to_string(a.dim_model) + ", " +
         std::to_string(a.n_encoder_layers) + "+" + std::to_string(a.n_decoder_layers) + " layers" +
         (a.use_vae ? " + " + std::to_string(a.n_vae_encoder_layers) + " VAE" : std::string()) + ", chunk " +
         std::to_string(a.chunk_size) + " x " + std::to_string(a.action_dim);
}

// The diffusers class of a model config (a UNet's or a PixArt
// transformer's config.json, their folder, or a pipeline folder holding
// unet/ or transformer/), or "" for anything else.
std::string diffusers_class(std::filesystem::path path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    if (fs::exists(path / "config.json"))
      path /= "config.json";
    else if (fs::exists(path / "unet" / "config.json"))
      path = path / "unet" / "config.json";
    else if (fs::exists(path / "transformer" / "config.json"))
      path = path / "transformer" / "config.json";
  }
  const auto j = json_object_file(path);
  if (j && j->contains("_class_name") && j->at("_class_name").is_string())
    return j->at("_class_name").get<std::string>();
  return "";
}

// A diffusion model's batch besides its latents: the target, the
// timesteps, the weights and the text (SDXL: pooled and time ids).
std::size_t diffusion_batch_bytes(std::int64_t batch, std::int64_t latent, std::int64_t text, std::int64_t extra) {
  return static_cast<std::size_t>(batch * (latent + 2 + text + extra)) * sizeof(float);
}

// The config's JSON when it is a LLaVA config (model_type "llava"); any
// other file, or one that does not read, takes the causal LM's path, whose
// reader names the problem.
std::optional<nlohmann::ordered_json> llava_json(std::filesystem::path path) {
  if (std::filesystem::is_directory(path)) path /= "config.json";
  auto j = json_object_file(path);
  if (j && j->contains("model_type") && j->at("model_type") == "llava") return j;
  return std::nullopt;
}

// hf::Llava once per train mode (default: LLaVA's stages, projector, then
// projector and tower, then everything), and the Trainer's activations for
// `batch` sequences of `seq_len` positions (default the image's features +
// 64): pixel_values float32 [B, C, H, W], x and y int32 [B, T].
void llava_modes(Inputs& in, const std::string& path, const nlohmann::ordered_json& j, const hf::LoraConfig& lora,
                 std::vector<std::string> train, std::int64_t batch, std::optional<std::int64_t> seq_len) {
  const hf::LlavaConfig c = hf::parse_llava_config(j, "\"" + path + "\"");
  const std::int64_t features = c.features_per_image();
  const std::int64_t T = seq_len.value_or(features + 64);
  if (T < features)
    throw usage_error{"--seq-len " + std::to_string(T) + " is shorter than the image's " + std::to_string(features) +
                          " feature tokens",
                      "give --seq-len " + std::to_string(features) + " or more (default: the features + 64)"};
  if (train.empty()) train = {"projector", "projector,vision", "all"};
  const hf::VisionConfig& v = c.vision;
  const auto batch_bytes =
      static_cast<std::size_t>(batch * v.num_channels * v.image_size * v.image_size) * sizeof(float) +
      2 * static_cast<std::size_t>(batch * T) * sizeof(std::int32_t);
  for (const std::string& parts : train) {
    hf::LlavaTrain t;
    try {
      t = hf::parse_llava_train(parts);
    } catch (const dtrain::error& e) {
      std::string_view problem = e.problem();  // "train: ...", as the examples' key reads
      if (problem.starts_with("train: ")) problem.remove_prefix(7);
      throw usage_error{"--train " + in_quotes(parts) + ": " + std::string(problem), e.fix()};
    }
    hf::Llava model(c, t, lora);
    Mode& m = in.modes.emplace_back();
    m.train = parts;
    m.units = declared_units(model);
    std::size_t all = 0;
    for (const auto& u : m.units) all += u.trainable + u.frozen, m.trainable += u.trainable;
    m.activations =
        model_activation_bytes(model, {batch, T}, 0, batch_bytes, dtype_bytes(in.precision), in.checkpointing);
    if (in.modes.size() == 1) {
      in.units = m.units, in.parameters = all, in.trainable = m.trainable, in.activations = m.activations;
      in.source = "transformers config " + path + " (llava: " + v.model_type + " " + std::to_string(v.image_size) +
                  " px, patch " + std::to_string(v.patch_size) + ", " + std::to_string(model.tower.layers.size()) +
                  " of " + std::to_string(v.num_hidden_layers) + " layers x " + std::to_string(v.hidden_size) + ", " +
                  std::to_string(features) + " features per image; " + c.text.model_type + " " +
                  std::to_string(c.text.num_hidden_layers) + " layers x " + std::to_string(c.text.hidden_size) +
                  ", vocabulary " + std::to_string(c.text.vocab_size) +
                  (lora.r > 0 ? ", LoRA rank " + std::to_string(lora.r) : std::string()) + "), batch " +
                  std::to_string(batch) + " x " + std::to_string(T) + " positions";
    }
  }
  in.micro_batch = batch * T;
}

Inputs parse(int argc, char** argv) {
  Inputs in;
  std::optional<std::size_t> params;
  std::optional<std::string> config, hf_config;
  hf::LoraConfig lora;  // --lora-r, --lora-targets
  std::string example = "mlp";
  std::optional<double> fraction;
  std::optional<std::size_t> unit_count;
  std::optional<std::size_t> activations;
  std::optional<std::vector<int>> world;
  std::optional<int> shard_group;
  std::vector<std::string> train;                   // --train, one mode each
  std::optional<std::int64_t> batch_size, seq_len;  // LLaVA's micro-batch
  bool checkpointing = false;                       // --activation-checkpointing
  std::vector<std::string> overrides;
  std::optional<std::string> training_flag;  // the first flag that --config replaces by a key
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inline_value;
    if (const auto eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg.resize(eq);
    }
    const auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw usage_error{arg + " needs a value", "write " + arg + " VALUE (see --help)"};
      return argv[++i];
    };
    if (std::find(training_flags.begin(), training_flags.end(), arg) != training_flags.end() && !training_flag)
      training_flag = arg;
    if (arg == "-h" || arg == "--help") {
      std::fputs(usage.data(), stdout);
      std::exit(0);
    } else if (arg == "--params")
      params = parse_count(value());
    else if (arg == "--hf-config")
      hf_config = value();
    else if (arg == "--lora-r")
      lora.r = parse_number<std::int64_t>(arg, value(), 1, 1e6);
    else if (arg == "--lora-targets")
      lora.targets = list_items(YAML::Node(value()));
    else if (arg == "--units")
      unit_count = parse_number<std::size_t>(arg, value(), 1, 1e9);
    else if (arg == "--trainable-fraction")
      fraction = parse_number<double>(arg, value(), 0, 1);
    else if (arg == "--config")
      config = value();
    else if (arg == "--example")
      example = one_of(arg, value(), examples_known);
    else if (arg == "--precision")
      in.precision = one_of(arg, value(), precisions);
    else if (arg == "--reduce-dtype")
      in.reduce_dtype = one_of(arg, value(), reduce_dtypes);
    else if (arg == "--optimizer")
      in.optimizer = one_of(arg, value(), optimizers);
    else if (arg == "--momentum")
      in.momentum = parse_number<double>(arg, value(), 0, 1);
    else if (arg == "--accumulate")
      in.accumulate = parse_number<int>(arg, value(), 1, 1e6);
    else if (arg == "--prefetch")
      in.prefetch = parse_number<int>(arg, value(), 0, 1e6);
    else if (arg == "--world") {
      world.emplace();
      for (const std::string& n : list_items(YAML::Node(value()))) world->push_back(parse_number<int>(arg, n, 1, 1e7));
      if (world->empty()) throw usage_error{"--world needs a number", "e.g. --world 8 or --world 1,2,4"};
    } else if (arg == "--train")
      train.push_back(value());
    else if (arg == "--batch-size")
      batch_size = parse_number<std::int64_t>(arg, value(), 1, 1e9);
    else if (arg == "--seq-len")
      seq_len = parse_number<std::int64_t>(arg, value(), 1, 1e9);
    else if (arg == "--activation-checkpointing")
      checkpointing = true;
    else if (arg == "--shard-group")
      shard_group = parse_number<int>(arg, value(), 1, 1e7);
    else if (arg == "--strategy")
      in.strategy = value();
    else if (arg == "--offload")
      in.offload = one_of(arg, value(), offloads);
    else if (arg == "--state-on-disk")
      in.state_on_disk = true;
    else if (arg == "--activations-bytes")
      activations = parse_number<std::size_t>(arg, value(), 0, 1e18);
    else if (arg == "--json")
      in.json = true;
    else if (!arg.starts_with("-") && arg.find('=') != std::string::npos && arg.find('=') != 0)
      overrides.push_back(arg);
    else
      throw usage_error{"unknown argument " + in_quotes(arg), "run dtrain-estimate --help"};
  }

  if (in.state_on_disk && in.offload == "none")
    throw usage_error{"--state-on-disk without an offload: the optimizer state is on the device",
                      "add --offload optimizer (or params, or all): the state then goes to files"};
  if (int{params.has_value()} + int{config.has_value()} + int{hf_config.has_value()} != 1)
    throw usage_error{params || config || hf_config ? "more than one of --params, --config and --hf-config name a model"
                                                    : "no model given",
                      "pass one of --params N, --config FILE.yaml and --hf-config config.json"};
  if (!hf_config && (lora.r != 0 || !lora.targets.empty()))
    throw usage_error{"--lora-r and --lora-targets need --hf-config", "estimate a transformers model's adapters"};
  if (hf_config && (lora.r == 0) != lora.targets.empty())
    throw usage_error{"give both --lora-r and --lora-targets", "e.g. --lora-r 16 --lora-targets all-linear"};
  if (hf_config) {
    if (!overrides.empty())
      throw usage_error{"key=value " + in_quotes(overrides.front()) + " needs --config", "use the flags (see --help)"};
    if (fraction || unit_count)
      throw usage_error{std::string(fraction ? "--trainable-fraction" : "--units") + " needs --params",
                        "the config's model gives the units"};
    const std::optional<nlohmann::ordered_json> llava = llava_json(*hf_config);
    const bool act = lerobot_act_json(*hf_config);
    const std::string diffusers = diffusers_class(*hf_config);
    const bool unet = diffusers == "UNet2DConditionModel", pixart = diffusers == "PixArtTransformer2DModel";
    if ((unet || pixart) && !train.empty())
      throw usage_error{"--train does not apply to a diffusion model",
                        "give --batch-size, --seq-len, --activation-checkpointing (and for a UNet --lora-r)"};
    if (act && (!train.empty() || seq_len))
      throw usage_error{std::string(!train.empty() ? "--train" : "--seq-len") + " does not apply to an ACT policy",
                        "give --batch-size (samples per rank) and --activation-checkpointing only"};
    if (!llava && !act && !unet && !pixart && (!train.empty() || batch_size || seq_len || checkpointing))
      throw usage_error{std::string(!train.empty() ? "--train"
                                    : batch_size   ? "--batch-size"
                                    : seq_len      ? "--seq-len"
                                                   : "--activation-checkpointing") +
                            " needs a LLaVA config (model_type llava)",
                        "drop it: the activations of other models come from --config or --activations-bytes"};
    try {
      if (unet || pixart) {
        // diffusers' UNet or PixArt at its sample_size: batch_size records per rank, seq_len text tokens
        const std::int64_t b = batch_size.value_or(1);
        in.checkpointing = checkpointing;
        in.micro_batch = b;
        const auto count = [&](auto& model) {
          in.units = declared_units(model);
          for (const auto& u : in.units) in.parameters += u.trainable + u.frozen, in.trainable += u.trainable;
        };
        if (unet) {
          models::UNetConfig c = diffusion::read_unet_config(*hf_config);
          c.context_length = seq_len.value_or(77);
          models::UNet2DCondition model(c, lora);
          count(model);
          const bool sdxl = c.addition_embed_type == "text_time";
          const std::int64_t pooled =
              sdxl ? c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim + 6 : 0;
          in.activations = model_activation_bytes(
              model, {b, 1}, model.input_features(),
              diffusion_batch_bytes(b, model.output_features(), c.context_length * c.cross_attention_dim, pooled),
              dtype_bytes(in.precision), in.checkpointing, in.checkpoint_every, in.checkpoint_units,
              in.checkpoint_budget);
          in.source = "diffusers UNet config " + *hf_config + " (" + std::to_string(c.block_out_channels.size()) +
                      " blocks, latents " + std::to_string(c.in_channels) + " x " + std::to_string(c.sample_height) +
                      " x " + std::to_string(c.sample_width) + ", text " + std::to_string(c.context_length) + " x " +
                      std::to_string(c.cross_attention_dim) + (sdxl ? ", SDXL text_time" : "") + ", batch " +
                      std::to_string(b) + (lora.on() ? ", LoRA r=" + std::to_string(lora.r) : "") + ")";
        } else {
          if (lora.r != 0) throw usage_error{"--lora-r does not apply to PixArt (no LoRA on it yet)", "drop it"};
          models::PixArtConfig c = diffusion::read_pixart_config(*hf_config);
          c.context_length = seq_len.value_or(300);
          models::PixArt model(c);
          count(model);
          in.activations =
              model_activation_bytes(model, {b, 1}, model.input_features(),
                                     diffusion_batch_bytes(b, c.in_channels * c.sample_height * c.sample_width,
                                                           c.context_length * c.caption_channels, c.context_length),
                                     dtype_bytes(in.precision), in.checkpointing, in.checkpoint_every,
                                     in.checkpoint_units, in.checkpoint_budget);
          in.source = "diffusers PixArt config " + *hf_config + " (" + std::to_string(c.num_layers) + " layers x " +
                      std::to_string(c.inner_dim()) + ", latents " + std::to_string(c.in_channels) + " x " +
                      std::to_string(c.sample_height) + " x " + std::to_string(c.sample_width) + ", patch " +
                      std::to_string(c.patch_size) + ", text " + std::to_string(c.context_length) + " x " +
                      std::to_string(c.caption_channels) + ", batch " + std::to_string(b) + ")";
        }
      } else if (act) {
        // LeRobot's ACT (a policy directory's config.json): batch_size samples per rank
        if (lora.r != 0) throw usage_error{"--lora-r does not apply to an ACT policy", "drop it"};
        const models::ActConfig a = lerobot::read_act_config(*hf_config);
        models::Act model(a);
        in.checkpointing = checkpointing;
        in.units = declared_units(model);
        for (const auto& u : in.units) in.parameters += u.trainable + u.frozen, in.trainable += u.trainable;
        const std::int64_t b = batch_size.value_or(8);
        in.activations = model_activation_bytes(model, {b, 1}, model.input_features(), act_batch_bytes(a, b),
                                                dtype_bytes(in.precision), in.checkpointing, in.checkpoint_every,
                                                in.checkpoint_units, in.checkpoint_budget);
        in.micro_batch = b;
        in.source = "LeRobot ACT config " + *hf_config + " (" + act_text(a) + ", batch " + std::to_string(b) + ")";
      } else if (llava) {
        in.checkpointing = checkpointing;
        llava_modes(in, *hf_config, *llava, lora, train, batch_size.value_or(1), seq_len);
      } else {
        const hf::LmConfig c = hf::read_config(*hf_config);
        hf::CausalLm model(c, lora);
        in.units = declared_units(model);
        for (const auto& u : in.units) in.parameters += u.trainable + u.frozen, in.trainable += u.trainable;
        in.source = "transformers config " + *hf_config + " (" + c.model_type + ", " +
                    std::to_string(c.num_hidden_layers) + " layers x " + std::to_string(c.hidden_size) +
                    ", vocabulary " + std::to_string(c.vocab_size) + ")";
      }
    } catch (const dtrain::error& e) {
      throw usage_error{e.problem(), e.fix()};
    }
    in.worlds = world.value_or(std::vector<int>{1});
  } else if (params) {
    if (!overrides.empty())
      throw usage_error{"key=value " + in_quotes(overrides.front()) + " needs --config", "use the flags (see --help)"};
    in.parameters = *params;
    in.trainable = static_cast<std::size_t>(std::llround(static_cast<double>(*params) * fraction.value_or(1.0)));
    const std::size_t u = unit_count.value_or(1);
    if (u > std::max<std::size_t>(in.trainable, 1))
      throw usage_error{"--units " + std::to_string(u) + " is more than the " + std::to_string(in.trainable) +
                            " trainable parameters",
                        "give at most one unit per trainable parameter"};
    for (std::size_t i = 0; i < u; ++i) in.units.push_back({in.trainable / u + (i < in.trainable % u ? 1 : 0), 0});
    if (in.trainable != in.parameters) in.units.push_back({0, in.parameters - in.trainable});
    in.worlds = world.value_or(std::vector<int>{1});
  } else {
    if (training_flag)
      throw usage_error{*training_flag + " is a --params flag",
                        "with --config write the example's key instead, e.g. precision=bf16"};
    if (fraction || unit_count)
      throw usage_error{std::string(fraction ? "--trainable-fraction" : "--units") + " needs --params",
                        "the example's model gives the units"};
    if (!world) throw usage_error{"--config needs --world N", "pass the number of ranks the example will run on"};
    const auto common = [&](const models::RunConfig& c) {
      in.precision = one_of("precision", c.precision, precisions);
      in.reduce_dtype = one_of("reduce_dtype", c.reduce_dtype, reduce_dtypes);
      in.optimizer = one_of("optimizer", c.optimizer, optimizers);
      in.momentum = c.momentum;
      in.accumulate = c.accumulate;
      in.prefetch = c.prefetch;
      in.config_strategy = c.strategy;
      in.checkpointing = c.activation_checkpointing;
      in.checkpoint_every = static_cast<std::size_t>(std::max<std::int64_t>(c.checkpoint_every, 1));
      for (const auto u : c.checkpoint_units) in.checkpoint_units.push_back(static_cast<std::size_t>(u));
      in.checkpoint_budget = models::trainer_options(c).checkpoint_budget_bytes;
      in.micro_batch = c.batch_size;
      if (c.shard_group > 0) shard_group = shard_group.value_or(c.shard_group);
      if (c.batch_size < 1 || c.shard_group < 0 || c.accumulate < 1)
        throw usage_error{"the config's batch_size, accumulate or shard_group is out of range",
                          "give batch_size and accumulate >= 1, shard_group >= 0"};
    };
    // The model's units as declared, and the Trainer's activation buffers.
    const auto from_model = [&](auto& model, dtrain::SeqShape shape, std::int64_t in_width, std::size_t batch_bytes) {
      in.units = declared_units(model);
      for (const auto& u : in.units) in.parameters += u.trainable + u.frozen, in.trainable += u.trainable;
      in.activations =
          model_activation_bytes(model, shape, in_width, batch_bytes, dtype_bytes(in.precision), in.checkpointing,
                                 in.checkpoint_every, in.checkpoint_units, in.checkpoint_budget);
    };
    try {
      if (example == "mlp") {
        const auto c = read_config<models::MlpConfig>(*config, overrides);
        common(c);
        if (c.hidden.empty() || c.features < 1 || c.classes < 1)
          throw usage_error{"the config's hidden, features or classes is out of range",
                            "give positive sizes, e.g. hidden=256,256 features=32"};
        models::MlpClassifier model(c, c.features, c.classes);
        from_model(model, {c.batch_size, 1}, c.features, static_cast<std::size_t>(c.batch_size) * sizeof(std::int32_t));
        in.source = "train_mlp config " + *config + " (MLP " + std::to_string(c.features);
        for (auto h : c.hidden) in.source += "-" + std::to_string(h);
        in.source += "-" + std::to_string(c.classes) + ")";
      } else if (example == "gpt") {
        const auto c = read_config<models::GptConfig>(*config, overrides);
        common(c);
        const models::Corpus corpus = models::make_corpus(c);
        models::Gpt model(corpus.tokenizer.vocab(), c.block_size, c.n_layer, c.n_head, c.n_embd);
        from_model(model, {c.batch_size, c.block_size}, 0,
                   2 * static_cast<std::size_t>(c.batch_size * c.block_size) * sizeof(std::int32_t));
        in.micro_batch = c.batch_size * c.block_size;
        in.source = "train_gpt config " + *config + " (GPT " + std::to_string(c.n_layer) + " x " +
                    std::to_string(c.n_embd) + ", " + std::to_string(c.block_size) + " positions, vocabulary " +
                    std::to_string(corpus.tokenizer.vocab()) + ")";
      } else if (example == "lm") {
        const auto c = read_config<models::CausalLmConfig>(*config, overrides);
        common(c);
        if (c.model.empty() == c.config.empty())
          throw usage_error{"a train_lm config needs one of model and config",
                            "give model=DIR (a transformers directory) or config=FILE (its config.json)"};
        if (c.block_size < 1)
          throw usage_error{"the config's block_size is out of range", "give a positive block_size, e.g. 128"};
        const hf::LmConfig hc = hf::read_config(c.model.empty() ? c.config : c.model);
        hf::CausalLm model(hc, c.lora());
        // x and y int32 [B, T], and packed records' position_ids int64
        const auto tokens = static_cast<std::size_t>(c.batch_size * c.block_size);
        from_model(model, {c.batch_size, c.block_size}, 0,
                   tokens * (2 * sizeof(std::int32_t) + (c.packing ? sizeof(std::int64_t) : 0)));
        in.micro_batch = c.batch_size * c.block_size;
        in.source = "train_lm config " + *config + " (" + hc.model_type + ", " + std::to_string(hc.num_hidden_layers) +
                    " layers x " + std::to_string(hc.hidden_size) + ", " + std::to_string(c.block_size) +
                    " positions, vocabulary " + std::to_string(hc.vocab_size) +
                    (c.lora().r > 0 ? ", LoRA rank " + std::to_string(c.lora().r) : std::string()) + ")";
      } else if (example == "vlm") {
        const auto c = read_config<models::LlavaRunConfig>(*config, overrides);
        common(c);
        if (c.model.empty() == c.config.empty())
          throw usage_error{"a train_vlm config needs one of model and config",
                            "give model=DIR (a transformers LLaVA directory) or config=FILE (its config.json)"};
        const std::string path = c.model.empty() ? c.config : c.model;
        const std::optional<nlohmann::ordered_json> j = llava_json(path);
        if (!j)
          throw usage_error{in_quotes(path) + " is not a LLaVA config (model_type llava)",
                            "give train_vlm's model= or config= a transformers LLaVA model"};
        llava_modes(in, path, *j, c.lora(), {c.train}, c.batch_size, seq_len);
        in.source = "train_vlm config " + *config + ": " + in.source;
      } else {
        const auto c = read_config<models::PolicyConfig>(*config, overrides);
        common(c);
        if (c.policy == "act") {
          const models::ActConfig a = models::simulator_act_config(c);
          models::Act model(a);
          from_model(model, {c.batch_size, 1}, model.input_features(), act_batch_bytes(a, c.batch_size));
          in.source = "train_policy config " + *config + " (policy=act: " + act_text(a) + ")";
        } else {
          models::Policy model(c);
          from_model(model, {c.batch_size, 1}, models::observation_dim(c),
                     static_cast<std::size_t>(c.batch_size * models::action_dim * c.horizon) * sizeof(float));
          in.source = "train_policy config " + *config + " (observation " + std::to_string(models::observation_dim(c)) +
                      ", action chunk " + std::to_string(c.horizon) + " x " + std::to_string(models::action_dim) + ")";
        }
      }
    } catch (const dtrain::error& e) {
      throw usage_error{e.problem(), e.fix()};
    }
    in.worlds = *world;
  }
  if (config || params) {
    if (!train.empty() || batch_size || (seq_len && !(config && example == "vlm")))
      throw usage_error{std::string(!train.empty() ? "--train"
                                    : batch_size   ? "--batch-size"
                                                   : "--seq-len") +
                            " needs a LLaVA --hf-config",
                        config ? "with --config write the example's keys instead, e.g. batch_size=8"
                               : "estimate a LLaVA model with --hf-config config.json"};
    if (checkpointing)
      throw usage_error{"--activation-checkpointing needs a LLaVA --hf-config",
                        config ? "with --config write activation_checkpointing=true"
                               : "with --params give the activations: --activations-bytes B"};
  }
  if (activations) {
    in.activations = *activations;
    for (Mode& m : in.modes) m.activations = *activations;
    in.micro_batch.reset();
  }
  in.world = in.worlds.front();
  // HybridShard's default group is the ranks of a node; a world of one node
  // is the only guess that needs no further input.
  in.shard_group_flag = shard_group;
  in.shard_group = shard_group.value_or(in.world);
  if (in.strategy != "all")
    for (const std::string& name : list_items(YAML::Node(in.strategy))) one_of("--strategy", name, estimate_strategies);
  return in;
}

// ---- estimating and printing ------------------------------------------------

struct Row {
  std::string train;  // LLaVA's mode
  int world = 1;
  std::size_t trainable = 0;
  std::string_view strategy;
  offload_kind offload = offload_kind::none;
  MemoryUsage memory;    // on the compute device
  MemoryUsage host;      // offloaded, in host memory
  std::size_t disk = 0;  // optimizer state in files
};

std::vector<Row> estimate(const Inputs& in) {
  EstimateInputs e;
  e.units = in.units;
  e.compute_bytes = dtype_bytes(in.precision);
  e.reduce_bytes = dtype_bytes(reduce_name(in));
  e.accumulate = in.accumulate;
  e.world = in.world;
  e.shard_group = in.shard_group;
  e.prefetch = in.prefetch;
  e.optimizer_states = optimizer_states(in);
  e.activations = in.activations;
  std::vector<offload_kind> offloads;
  if (in.offload == "all")
    offloads = {offload_kind::none, offload_kind::optimizer, offload_kind::params};
  else
    offloads = {parse_offload(in.offload)};
  std::vector<Row> rows;
  const std::vector<std::string> asked = list_items(YAML::Node(in.strategy));
  for (auto name : estimate_strategies) {
    if (in.strategy != "all" && std::find(asked.begin(), asked.end(), name) == asked.end()) continue;
    e.strategy = std::string(name);
    const bool shards_params = name.starts_with("fsdp");
    for (const offload_kind k : offloads) {
      // params with a replicating strategy: skipped under "all" (or a list), an error when asked for.
      if (k == offload_kind::params && !shards_params &&
          (in.offload == "all" || in.strategy == "all" || asked.size() != 1))
        continue;
      e.offload = k;
      e.state_on_disk = in.state_on_disk && k != offload_kind::none;
      try {
        const MemorySplit m = estimate_memory_split(e);
        Row& r = rows.emplace_back();
        r.strategy = name, r.offload = k, r.memory = m.device, r.host = m.host, r.disk = m.disk;
      } catch (const dtrain::error& err) {
        throw usage_error{err.problem(), err.fix()};
      }
    }
  }
  return rows;
}

// Every mode (LLaVA's; else the one model) at every world size.
std::vector<Row> estimate_all(const Inputs& in) {
  std::vector<Mode> modes = in.modes;
  if (modes.empty()) modes.push_back({"", in.units, in.trainable, in.activations});
  std::vector<Row> rows;
  for (const Mode& m : modes)
    for (const int w : in.worlds) {
      Inputs one = in;
      one.units = m.units, one.trainable = m.trainable, one.activations = m.activations;
      one.world = w, one.shard_group = in.shard_group_flag.value_or(w);
      for (Row& r : estimate(one)) {
        r.train = m.train, r.world = w, r.trainable = m.trainable;
        rows.push_back(std::move(r));
      }
    }
  return rows;
}

std::string thousands(std::size_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string number_list(const std::vector<int>& v) {
  std::string out;
  for (const int n : v) {
    if (!out.empty()) out += ',';
    out += std::to_string(n);
  }
  return out;
}

std::string describe(const Inputs& in) {
  std::string d = thousands(in.parameters) + " parameters in " + std::to_string(in.units.size()) +
                  (in.units.size() == 1 ? " unit" : " units");
  if (in.trainable != in.parameters && in.modes.empty()) d += " (" + thousands(in.trainable) + " trainable)";
  d += ", precision " + in.precision + ", reduce " + reduce_name(in);
  d += ", " + in.optimizer + " (" + std::to_string(optimizer_states(in)) + " fp32 states/param)";
  if (in.worlds.size() > 1) {
    d += ", worlds " + number_list(in.worlds) + ", group ";
    d += in.shard_group_flag ? std::to_string(*in.shard_group_flag) : std::string("the world");
  } else {
    d += ", world " + std::to_string(in.world) + ", group " + std::to_string(in.shard_group);
  }
  if (in.micro_batch) d += ", micro-batch " + std::to_string(*in.micro_batch) + " rows";
  if (in.checkpointing) {
    d += ", activation checkpointing";
    if (in.checkpoint_budget != 0)
      d += " within " + std::to_string(in.checkpoint_budget) + " bytes";
    else if (!in.checkpoint_units.empty())
      d += " of " + std::to_string(in.checkpoint_units.size()) + " named units";
    else if (in.checkpoint_every > 1)
      d += " of one unit in " + std::to_string(in.checkpoint_every);
  }
  d += ", accumulate " + std::to_string(in.accumulate) + ", prefetch " + std::to_string(in.prefetch);
  return d;
}

// A Markdown table (pastes into docs), columns as wide as their widest cell.
void print_table(const Inputs& in, const std::vector<Row>& rows) {
  std::printf("dtrain-estimate: %s%s%s\n", in.source.c_str(), in.source.empty() ? "" : ": ", describe(in).c_str());
  std::printf("activations: %s\n\n", in.micro_batch ? "the Trainer's buffers for one micro-batch (units' transient "
                                                      "workspace not included)"
                                                    : "as given by --activations-bytes (default 0)");
  for (const Mode& m : in.modes)
    std::printf("train %s: %s of %s parameters\n", m.train.c_str(), thousands(m.trainable).c_str(),
                thousands(in.parameters).c_str());
  if (!in.modes.empty()) std::printf("\n");
  // With an offload the columns are the device's, then the offloaded host bytes.
  const bool offloading = in.offload != "none";
  std::vector<std::vector<std::string>> table = {
      {"strategy (MiB)", "params", "grads", "optimizer state", "master", "gathered", "activations", "total per rank"}};
  // LLaVA's modes and several worlds: a column each before the strategy.
  const bool by_mode = !in.modes.empty(), by_world = in.worlds.size() > 1;
  const std::size_t labels = 1 + (by_mode ? 1 : 0) + (by_world ? 1 : 0);
  if (by_world) table[0].insert(table[0].begin(), "world");
  if (by_mode) table[0].insert(table[0].begin(), "train");
  if (offloading) {
    table[0].insert(table[0].begin() + static_cast<std::ptrdiff_t>(labels), "offload");
    table[0].back() = "device total";
    table[0].push_back("host (offloaded)");
    if (in.state_on_disk) table[0].push_back("disk (optimizer state)");
  }
  const auto mib = [](std::size_t bytes) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return std::string(t);
  };
  for (const Row& r : rows) {
    const MemoryUsage& m = r.memory;
    auto& line = table.emplace_back();
    if (by_mode) line.push_back(r.train);
    if (by_world) line.push_back(std::to_string(r.world));
    line.push_back(std::string(r.strategy) + (r.strategy == in.config_strategy ? " *" : ""));
    if (offloading) line.emplace_back(offload_name(r.offload));
    for (std::size_t bytes : {m.params, m.grads, m.optimizer, m.master, m.gathered, m.activations, m.total()})
      line.push_back(mib(bytes));
    if (offloading) line.push_back(mib(r.host.total()));
    if (offloading && in.state_on_disk) line.push_back(mib(r.disk));
  }
  std::vector<std::size_t> width(table[0].size());
  for (const auto& line : table)
    for (std::size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  const auto print_line = [&](const std::vector<std::string>& line) {
    for (std::size_t c = 0; c < line.size(); ++c) {
      const std::string pad(width[c] - line[c].size(), ' ');
      // the mode, world and strategy left-aligned, the numbers right-aligned
      std::printf("| %s ", (c < labels ? line[c] + pad : pad + line[c]).c_str());
    }
    std::printf("|\n");
  };
  print_line(table[0]);
  for (std::size_t c = 0; c < width.size(); ++c)
    std::printf("|%s%s", std::string(width[c] + 1, '-').c_str(), c < labels ? "-" : ":");
  std::printf("|\n");
  for (std::size_t r = 1; r < table.size(); ++r) print_line(table[r]);
  if (!in.config_strategy.empty()) std::printf("\n* the config's strategy\n");
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void print_json(const Inputs& in, const std::vector<Row>& rows) {
  // Several worlds: a list, and each row's "world"; the group then follows each unless given.
  const bool several = in.worlds.size() > 1;
  const std::string world = several ? "[" + number_list(in.worlds) + "]" : std::to_string(in.world);
  const std::string group = in.shard_group_flag ? std::to_string(*in.shard_group_flag)
                            : several           ? std::string("null")
                                                : std::to_string(in.shard_group);
  std::printf(
      "{\n  \"inputs\": {\"model\": %s, \"parameters\": %zu, \"trainable\": %zu, \"precision\": %s, "
      "\"reduce_dtype\": %s, \"optimizer\": %s, \"optimizer_states\": %zu, \"world\": %s, "
      "\"shard_group\": %s, \"micro_batch\": %s, \"activation_checkpointing\": %s, \"accumulate\": %d, "
      "\"prefetch\": %d, \"config_strategy\": %s},\n  \"unit\": \"bytes\",\n  \"strategies\": [",
      in.source.empty() ? "null" : json_string(in.source).c_str(), in.parameters, in.trainable,
      json_string(in.precision).c_str(), json_string(reduce_name(in)).c_str(), json_string(in.optimizer).c_str(),
      optimizer_states(in), world.c_str(), group.c_str(),
      in.micro_batch ? std::to_string(*in.micro_batch).c_str() : "null", in.checkpointing ? "true" : "false",
      in.accumulate, in.prefetch, in.config_strategy.empty() ? "null" : json_string(in.config_strategy).c_str());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const MemoryUsage& m = rows[i].memory;
    const MemoryUsage& h = rows[i].host;
    // LLaVA's rows name their mode and its trainable parameters
    const std::string mode = in.modes.empty() ? std::string()
                                              : "\"train\": " + json_string(rows[i].train) +
                                                    ", \"trainable\": " + std::to_string(rows[i].trainable) + ", ";
    std::printf(
        "%s\n    {%s\"world\": %d, \"strategy\": %s, \"offload\": %s, \"params\": %zu, \"grads\": %zu, \"optimizer\": "
        "%zu, "
        "\"master\": %zu, \"gathered\": %zu, \"activations\": %zu, \"other\": %zu, \"total\": %zu, "
        "\"host\": {\"params\": %zu, \"grads\": %zu, \"optimizer\": %zu, \"master\": %zu, \"total\": %zu}, "
        "\"disk\": %zu}",
        i ? "," : "", mode.c_str(), rows[i].world, json_string(rows[i].strategy).c_str(),
        json_string(offload_name(rows[i].offload)).c_str(), m.params, m.grads, m.optimizer, m.master, m.gathered,
        m.activations, m.other, m.total(), h.params, h.grads, h.optimizer, h.master, h.total(), rows[i].disk);
  }
  std::printf("\n  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Inputs in = parse(argc, argv);
    const std::vector<Row> rows = estimate_all(in);
    if (in.json)
      print_json(in, rows);
    else
      print_table(in, rows);
    return 0;
  } catch (const usage_error& e) {
    std::fprintf(stderr, "dtrain-estimate: %s; fix: %s\n", e.problem.c_str(), e.fix.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-estimate: %s\n", e.what());
    return 1;
  }
}
