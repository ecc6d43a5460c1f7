// train_gpt: trains a small GPT, a character-level language model, with
// dtrain on every rank it was launched with (dtrain-run, torchrun, srun,
// mpirun, or alone).
//
//   dtrain-run --nproc-per-node 2 train_gpt --config examples/configs/gpt_host.yaml strategy=fsdp-full
//
// Compiled by g++ only: yaml-cpp and range-v3 stay out of the nvcc translation units.

#include <cstdio>
#include <exception>
#include <string>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "gpt.hpp"

namespace gpt {
namespace {

constexpr const char* usage = R"(Trains a small GPT (token + position embeddings, n_layer pre-LayerNorm
transformer blocks, an untied head) on the characters of a text, on every
rank this process was launched with, and reports tokens/s and the held-out
loss.
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("data", c.data, "generated | a text file (trained on its first nine tenths)");
  r.add("corpus_bytes", c.corpus_bytes, "size of the generated corpus");
  r.add("data_seed", c.data_seed, "seed of the generated corpus");
  r.add("block_size", c.block_size, "positions per sequence");
  r.add("n_layer", c.n_layer, "transformer blocks");
  r.add("n_head", c.n_head, "attention heads");
  r.add("n_embd", c.n_embd, "model width");
  r.add("eval_batches", c.eval_batches, "held-out batches per rank evaluated at the end (0 = none)");
}

void validate_extra(const Config& c) {
  if (c.block_size < 1 || c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1 || c.corpus_bytes < 1 || c.eval_batches < 0)
    throw dtrain::config_error("block_size, n_layer, n_head, n_embd and corpus_bytes must be >= 1, eval_batches >= 0",
                               "see train_gpt --help");
  if (c.n_embd % c.n_head != 0)
    throw dtrain::config_error(
        "n_embd = " + std::to_string(c.n_embd) + " is not a multiple of n_head = " + std::to_string(c.n_head),
        "choose n_embd = n_head x head width, e.g. n_embd=128 n_head=4");
}

}  // namespace
}  // namespace gpt

int main(int argc, char** argv) {
  try {
    const auto cfg =
        examples::parse_cli<gpt::Config>(argc, argv, "train_gpt", gpt::usage, gpt::declare_extra, gpt::validate_extra);
    auto world = examples::init_world(cfg);
    const gpt::Corpus corpus = gpt::make_corpus(cfg);
    if (world.rank() == 0)
      std::printf(
          "train_gpt: %d rank(s), strategy=%s device=%s precision=%s accumulate=%d batch=%lld/rank x %lld "
          "positions, %zu characters, vocabulary %lld, %lld layers x %lld wide\n",
          world.size(), cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate,
          static_cast<long long>(cfg.batch_size), static_cast<long long>(cfg.block_size), corpus.tokens.size(),
          static_cast<long long>(corpus.tokenizer.vocab()), static_cast<long long>(cfg.n_layer),
          static_cast<long long>(cfg.n_embd));
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return gpt::train_cuda(cfg, world, corpus);
#else
      throw dtrain::config_error("this train_gpt was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
    }
    return gpt::train_host(cfg, world, corpus);
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
