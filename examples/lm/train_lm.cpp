// train_lm: fine-tunes a GPT-2 or Llama-family transformers checkpoint (or trains one
// from its config) on a pre-tokenized file, with dtrain on every rank it was
// launched with, and can write the result back as a transformers directory.
//
//   dtrain-run --nproc-per-node 2 train_lm model=./tinyllama data=tokens.npy save_hf=./tuned strategy=fsdp-full
//
// Compiled by g++ only: yaml-cpp and range-v3 stay out of the nvcc translation units.

#include <cstdio>
#include <exception>
#include <string>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "lm.hpp"

namespace lm {
namespace {

constexpr const char* usage = R"(Trains a causal language model (gpt2, llama, mistral, qwen2, qwen3, gemma,
gemma3_text) on a pre-tokenized file, on every rank this process was
launched with, and reports tokens/s and the held-out loss. data: the token
ids, a 1-D int32/int64 .npy or a .bin token stream (header DTRNTOK1, id
width 2 or 4), cut into windows; or instruction records, a .jsonl of
{"input_ids": [...], "labels": [...]} (-100: no loss) or {"input_ids":
[...], "prompt_length": N}, one sequence each (cut to block_size + 1,
padded), the loss over completion tokens only. The last tenth is held out.
objective=dpo: preference tuning (DPO) on a .jsonl of pairs,
{"prompt_ids": [...], "chosen_ids": [...], "rejected_ids": [...]} (with
"ref_chosen_logps" and "ref_rejected_logps" when precomputed), batch_size
pairs per rank and micro-batch; the held-out loss is the DPO loss.
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("model", c.model,
        "a transformers model directory (config.json + model.safetensors or a sharded index) to fine-tune");
  r.add("config", c.config, "or a config.json to train from scratch (one of the two)");
  r.add("data", c.data, "the token ids (see above)");
  r.add("block_size", c.block_size, "positions per sequence (at most max_position_embeddings)");
  r.add("save_hf", c.save_hf, "at the end, write the model here as a transformers directory");
  r.add("eval_batches", c.eval_batches, "held-out batches per rank evaluated at the end (0 = none)");
  r.add("generate", c.generate,
        "at the end, continue a prompt by this many tokens and print the ids (those after \" |\" are generated)");
  r.add("prompt", c.prompt, "the prompt's ids, e.g. 1,15,27 (default: the first 8 held-out tokens)");
  r.add("top_k", c.top_k, "generate: sample among the k likeliest (0: all), seeded by seed");
  r.add("top_p", c.top_p, "generate: sample among the fewest likeliest whose probabilities reach top_p (1: all)");
  r.add("temperature", c.temperature,
        "generate: divide the logits by it before sampling; 0: greedy unless top_k or top_p asks to sample (then 1)");
  r.add("stop", c.stop, "generate: token ids that end the continuation (kept in it), e.g. the tokenizer's eos");
  r.add("generate_batch", c.generate_batch,
        "generate: continue this many copies of the prompt in one batch (each its own sampling stream; the "
        "tokens/s counts them all)");
  r.add("packing", c.packing,
        "records (.jsonl): pack the training records end to end into blocks of block_size, each attending only "
        "to itself (position_ids restart per record), instead of one padded record per sequence");
  r.add("checkpoint_modules", c.checkpoint_modules,
        "with activation_checkpointing: recompute the units of these transformers modules, by name or shell "
        "pattern, e.g. layers.* or model.layers.1? (GPT-2: h.*) (instead of checkpoint_units numbers)");
  r.section("Preference tuning (objective=dpo; TRL's DPOTrainer)");
  r.add("objective", c.objective, "lm: next-token cross-entropy; dpo: direct preference optimisation on pairs");
  r.add("beta", c.beta,
        "dpo, grpo: how far the policy may move from the reference (TRL's beta; default DPO 0.1, GRPO 0: no "
        "reference)");
  r.add("loss_type", c.loss_type, "dpo: sigmoid (DPO), hinge, ipo (length-normalised), robust (label smoothing)");
  r.add("label_smoothing", c.label_smoothing, "dpo, loss_type=robust: the probability a preference label is flipped");
  r.add("reference", c.reference,
        "dpo: the reference log-probabilities: base (the policy with its LoRA adapters off: no second copy), copy "
        "(a frozen copy of ref_model, default model=, held like the policy: sharded under FSDP), data (precomputed "
        "in the pairs file), auto (data when every pair has them, else base with LoRA, else copy)");
  r.add("ref_model", c.ref_model, "dpo, reference=copy: the reference's transformers directory (default: model=)");
  r.section("Online RL (objective=grpo; TRL's GRPOTrainer)");
  r.add("reward", c.reward,
        "grpo: token:ID (how many times the completion holds token ID) or regex:PATTERN (1 when the completion, "
        "decoded with vocab_file, matches)");
  r.add("vocab_file", c.vocab_file, "grpo, reward=regex: the tokenizer's vocab.json, or one token per line");
  r.add("num_generations", c.num_generations, "grpo: completions per prompt (TRL's default 8)");
  r.add("max_new_tokens", c.max_new_tokens, "grpo: tokens per completion at most");
  r.add("epsilon", c.epsilon, "grpo: the probability ratio's clip (TRL's epsilon)");
  r.add("epsilon_high", c.epsilon_high, "grpo: its upper clip (0: epsilon)");
  r.section("LoRA adapters (PEFT's format; the base model frozen)");
  examples::declare_lora(
      r, c,
      {.rank = "adapter rank (0: no adapters, every weight trains)",
       .targets = "PEFT's target_modules: module names or suffixes, e.g. q_proj,k_proj,v_proj,o_proj (Llama), "
                  "c_attn,c_proj,c_fc (GPT-2), lm_head (an untied output head), or all-linear (the blocks' linear "
                  "layers)",
       .modules_to_save = "PEFT's modules_to_save: train these whole beside the adapters and save them with them: "
                          "embed_tokens, lm_head (untied models), GPT-2's wpe"});
  r.add("adapter", c.adapter,
        "a PEFT adapter directory to load onto model= (its adapter_config.json sets the lora_ keys)");
  r.add("save_adapter", c.save_adapter, "at the end, write the adapters here for peft.PeftModel.from_pretrained");
}

void validate_extra(const Config& c) {
  if (c.model.empty() == c.config.empty())
    throw dtrain::config_error("give exactly one of model=DIR (fine-tune) and config=FILE (from scratch)",
                               "see train_lm --help");
  if (c.data.empty())
    throw dtrain::config_error("data= is missing",
                               "pass data=FILE.npy or FILE.bin of token ids, or FILE.jsonl records");
  if (!c.adapter.empty() && c.model.empty())
    throw dtrain::config_error("adapter= needs the base model it adapts", "give model=DIR too");
  if (!c.adapter.empty() && (c.lora_r != 0 || !c.lora_targets.empty() || !c.lora_modules_to_save.empty()))
    throw dtrain::config_error("adapter= and lora_r/lora_targets/lora_modules_to_save both say which adapters to build",
                               "give one: adapter=DIR reads them from its adapter_config.json");
  if (c.lora_r == 0 && c.adapter.empty() && (!c.lora_targets.empty() || !c.save_adapter.empty()))
    throw dtrain::config_error(
        std::string(c.save_adapter.empty() ? "lora_targets" : "save_adapter") + " without adapters",
        "give lora_r=R (e.g. 16) and lora_targets=..., or adapter=DIR");
  if (c.packing && !c.data.ends_with(".jsonl"))
    throw dtrain::config_error("packing=true needs instruction records (data=FILE.jsonl); '" + c.data +
                                   "' is a token stream, which is cut into full windows already",
                               "give data=FILE.jsonl, or drop packing=true");
  if (c.objective != "lm" && c.objective != "dpo" && c.objective != "grpo")
    throw dtrain::config_error("objective '" + c.objective + "' is not one train_lm has", "give lm, dpo or grpo");
  if (c.objective != "grpo" && (!c.reward.empty() || !c.vocab_file.empty()))
    throw dtrain::config_error("reward and vocab_file belong to objective=grpo", "add objective=grpo");
  if (c.grpo()) {
    dtrain::nn::GrpoLoss({.epsilon = c.epsilon, .epsilon_high = c.epsilon_high, .beta = c.beta_or_default()});
    if (!c.data.ends_with(".jsonl"))
      throw dtrain::config_error("objective=grpo reads prompts from a .jsonl file; '" + c.data + "' is not one",
                                 "give data=PROMPTS.jsonl, one {\"prompt_ids\": [...]} per line");
    if (!c.reward.starts_with("token:") && !c.reward.starts_with("regex:"))
      throw dtrain::config_error("objective=grpo needs a reward: reward=" + c.reward,
                                 "give reward=token:ID or reward=regex:PATTERN (with vocab_file=)");
    if (c.reward.starts_with("regex:") && c.vocab_file.empty())
      throw dtrain::config_error("reward=regex: matches decoded completions, and there is no vocab_file",
                                 "give vocab_file= the tokenizer's vocab.json (or one token per line)");
    if (c.num_generations < 2 || c.batch_size % c.num_generations != 0)
      throw dtrain::config_error("num_generations " + std::to_string(c.num_generations) +
                                     " does not divide batch_size " + std::to_string(c.batch_size) +
                                     " (completions per rank and micro-batch, TRL's per_device_train_batch_size)",
                                 "give num_generations >= 2 and batch_size a multiple of it, e.g. batch_size=" +
                                     std::to_string(std::max<std::int64_t>(2, c.num_generations) * 2));
    if (c.max_new_tokens < 1 || c.packing)
      throw dtrain::config_error("objective=grpo with max_new_tokens " + std::to_string(c.max_new_tokens) +
                                     (c.packing ? " and packing=true" : ""),
                                 "give max_new_tokens >= 1 and no packing");
    if (c.reference != "auto" && c.reference != "base" && c.reference != "copy")
      throw dtrain::config_error("reference '" + c.reference + "' with objective=grpo",
                                 "give base or copy (or auto), used when beta > 0");
  } else if (c.dpo()) {
    dtrain::nn::PreferenceLoss({.type = dtrain::nn::preference_loss_named(c.loss_type),
                                .beta = c.beta_or_default(),
                                .label_smoothing = c.label_smoothing});  // its own checks, with their fixes
    if (!c.data.ends_with(".jsonl"))
      throw dtrain::config_error("objective=dpo reads preference pairs from a .jsonl file; '" + c.data + "' is not one",
                                 "give data=PAIRS.jsonl, one {\"prompt_ids\", \"chosen_ids\", \"rejected_ids\"} "
                                 "per line");
    if (c.packing)
      throw dtrain::config_error("packing=true with objective=dpo", "drop packing: a pair's sequences stay whole");
    if (c.reference != "auto" && c.reference != "base" && c.reference != "copy" && c.reference != "data")
      throw dtrain::config_error("reference '" + c.reference + "' is not one train_lm has",
                                 "give base, copy, data or auto");
  } else if (c.reference != "auto" || !c.ref_model.empty() || c.loss_type != "sigmoid" || c.beta >= 0.f) {
    throw dtrain::config_error("reference, ref_model, loss_type and beta belong to objective=dpo or grpo",
                               "add objective=dpo or objective=grpo");
  }
  examples::validate_checkpoint_modules(c, c.checkpoint_modules);
  if (c.block_size < 1 || c.eval_batches < 0 || c.generate < 0 || c.top_k < 0 || !(c.top_p > 0.f && c.top_p <= 1.f) ||
      !(c.temperature >= 0.f) || c.generate_batch < 1)
    throw dtrain::config_error(
        "block_size must be >= 1, eval_batches, generate, top_k and temperature >= 0, and top_p in "
        "(0, 1]",
        "see train_lm --help");
}

// reference=auto made definite, and what each choice needs checked: data
// needs every pair's reference log-probabilities, base LoRA adapters, copy
// a reference model of the policy's architecture.
void resolve_reference(Config& c, const dtrain::hf::LmConfig& policy, const Tokens& t) {
  if (c.grpo() && c.beta_or_default() == 0.f) {  // no KL term: no reference
    c.reference = "none";
    return;
  }
  std::size_t with = 0;
  for (const auto& p : t.pairs) with += p.ref_chosen.has_value() ? 1 : 0;
  const bool lora = c.lora_r > 0 || !c.adapter.empty();
  if (c.reference == "auto") c.reference = c.dpo() && with == t.pairs.size() ? "data" : lora ? "base" : "copy";
  if (c.reference == "data" && with != t.pairs.size())
    throw dtrain::config_error("reference=data, but " + std::to_string(t.pairs.size() - with) + " of " +
                                   std::to_string(t.pairs.size()) + " pairs in '" + c.data +
                                   "' have no ref_chosen_logps/ref_rejected_logps",
                               "precompute them for every pair, or use reference=base (LoRA) or reference=copy");
  if (c.reference == "base" && !lora)
    throw dtrain::config_error("reference=base is the policy with its LoRA adapters off, and this run has none",
                               "add lora_r=R lora_targets=..., or use reference=copy (a frozen copy of the model)");
  if (c.reference == "base" && !c.lora_modules_to_save.empty())
    throw dtrain::config_error(
        "reference=base with lora_modules_to_save: those modules train whole, so the policy "
        "with its adapters off is no longer the base model",
        "use reference=copy (a frozen copy of the model), or drop lora_modules_to_save");
  if (!c.ref_model.empty() && c.reference != "copy")
    throw dtrain::config_error("ref_model= with reference=" + c.reference, "use reference=copy with ref_model=");
  if (c.reference != "copy") return;
  if (c.ref_model.empty()) c.ref_model = c.model;
  if (c.ref_model.empty())
    throw dtrain::config_error(
        "reference=copy loads the reference from a model directory, and there is none "
        "(config= trains from scratch)",
        "give ref_model=DIR, or train with LoRA (reference=base), or precompute the reference "
        "log-probabilities (reference=data)");
  const dtrain::hf::LmConfig r = dtrain::hf::read_config(c.ref_model);
  const std::pair<const char*, bool> differs[] = {
      {"model_type", r.model_type != policy.model_type},
      {"vocab_size", r.vocab_size != policy.vocab_size},
      {"hidden_size", r.hidden_size != policy.hidden_size},
      {"intermediate_size", r.intermediate_size != policy.intermediate_size},
      {"num_hidden_layers", r.num_hidden_layers != policy.num_hidden_layers},
      {"num_attention_heads", r.num_attention_heads != policy.num_attention_heads},
      {"num_key_value_heads", r.num_key_value_heads != policy.num_key_value_heads}};
  for (const auto& [key, d] : differs)
    if (d)
      throw dtrain::config_error("the reference '" + c.ref_model + "' differs from the policy in " + key +
                                     ": a reference has the policy's architecture",
                                 "give ref_model= a checkpoint of the same model (or leave it out: the reference "
                                 "is then model=)");
}

}  // namespace
}  // namespace lm

int main(int argc, char** argv) {
  try {
    auto cfg =
        examples::parse_cli<lm::Config>(argc, argv, "train_lm", lm::usage, lm::declare_extra, lm::validate_extra);
    const dtrain::hf::LmConfig config = dtrain::hf::read_config(cfg.model.empty() ? cfg.config : cfg.model);
    for (const auto u : dtrain::hf::units_named(config, cfg.checkpoint_modules))
      cfg.checkpoint_units.push_back(static_cast<std::int64_t>(u));
    if (cfg.block_size > config.max_position_embeddings)
      throw dtrain::config_error("block_size " + std::to_string(cfg.block_size) + " is longer than the model's " +
                                     std::to_string(config.max_position_embeddings) +
                                     " positions (max_position_embeddings)",
                                 "use block_size <= " + std::to_string(config.max_position_embeddings));
    lm::Tokens tokens = cfg.dpo()    ? lm::read_pairs(cfg.data, cfg.block_size, config.vocab_size)
                        : cfg.grpo() ? lm::read_prompts(cfg.data, cfg.block_size, config.vocab_size, cfg.max_new_tokens)
                                     : lm::read_tokens(cfg.data, cfg.block_size, config.vocab_size);
    if (cfg.dpo() || cfg.grpo()) lm::resolve_reference(cfg, config, tokens);
    if (cfg.packing) tokens.packs = lm::pack_records(tokens, cfg.block_size);
    for (const auto id : cfg.prompt)
      if (id < 0 || id >= config.vocab_size)
        throw dtrain::config_error(
            "prompt id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(config.vocab_size),
            "give prompt ids the model's tokenizer produced");
    auto world = examples::init_world(cfg);
    if (world.rank() == 0)
      std::printf(
          "train_lm: %d rank(s), %s, strategy=%s device=%s precision=%s accumulate=%d batch=%lld/rank x %lld "
          "positions, %zu %s, vocabulary %lld, %lld layers x %lld wide\n",
          world.size(), config.model_type.c_str(), cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(),
          cfg.accumulate, static_cast<long long>(cfg.batch_size), static_cast<long long>(cfg.block_size),
          tokens.dpo()    ? tokens.pairs.size()
          : tokens.grpo() ? tokens.prompts.size()
          : tokens.sft()  ? tokens.records.size()
                          : tokens.ids.size(),
          tokens.dpo()    ? "pairs"
          : tokens.grpo() ? "prompts"
          : tokens.sft()  ? "records"
                          : "tokens",
          static_cast<long long>(config.vocab_size), static_cast<long long>(config.num_hidden_layers),
          static_cast<long long>(config.hidden_size));
    if (world.rank() == 0 && cfg.grpo())
      std::printf(
          "grpo: %lld completions per prompt, up to %lld new tokens, reward %s, loss_type dapo, epsilon %g, "
          "beta %g, reference %s\n",
          static_cast<long long>(cfg.num_generations), static_cast<long long>(cfg.max_new_tokens), cfg.reward.c_str(),
          static_cast<double>(cfg.epsilon), static_cast<double>(cfg.beta_or_default()), cfg.reference.c_str());
    if (world.rank() == 0 && cfg.dpo())
      std::printf("dpo: loss_type=%s beta=%g, reference %s%s\n", cfg.loss_type.c_str(),
                  static_cast<double>(cfg.beta_or_default()), cfg.reference.c_str(),
                  cfg.reference == "base"   ? " (the policy with its adapters off)"
                  : cfg.reference == "data" ? " (precomputed in the pairs file)"
                                            : (" (a frozen copy of " + cfg.ref_model + ")").c_str());
    if (world.rank() == 0 && cfg.packing) {
      std::int64_t used = 0;
      for (std::int64_t i = 0; i < tokens.split; ++i) used += tokens.records[static_cast<std::size_t>(i)].length;
      std::printf(
          "packing: %lld training records in %zu blocks of %lld positions (%.1f%% tokens, padded one per "
          "sequence %.1f%%)\n",
          static_cast<long long>(tokens.split), tokens.packs.size(), static_cast<long long>(cfg.block_size),
          100.0 * static_cast<double>(used) / static_cast<double>(tokens.packs.size() * cfg.block_size),
          100.0 * static_cast<double>(used) / static_cast<double>(tokens.split * cfg.block_size));
    }
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return lm::train_cuda(cfg, world, config, tokens);
#else
      throw dtrain::config_error("this train_lm was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
    }
    return lm::train_host(cfg, world, config, tokens);
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
