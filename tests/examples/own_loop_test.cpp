// own_loop (a hand-written loop over dtrain's public pieces, no Trainer)
// against train_mlp (the Trainer) on the same job, as real processes launched
// by dtrain-run at 2 ranks: they must end with the same parameters, to the bit.
//
// Bit-identical, not merely close: own_loop does the Trainer's arithmetic in
// the Trainer's order (the same initial values from the seed, the same
// batches, units, fp32 micro-batch sums, loss normaliser, reductions summed
// in rank order by the shared-memory transport, and the same fused optimizer
// pass), and nothing in that chain depends on timing. Any difference is a
// real divergence between the two loops.
#define BOOST_TEST_MODULE example_own_loop
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "examples/run_example.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/io/safetensors.hpp>

namespace fs = std::filesystem;
using dtrain::test::last_log;
using dtrain::test::run_example;
using dtrain::test::scratch;

namespace {

// The job both programs run: train_mlp's model and synthetic data, sized so
// that DDP reduces two buckets (the first closes past 1 MiB, inside the
// 500x600 layer) and ZeRO-1 pads a unit (the head's 2505 parameters over 2
// ranks), with every key either program reads set explicitly.
const std::string job =
    " hidden=600,500 samples=2048 features=12 classes=5 batch_size=24 lr=0.005 weight_decay=0.01 no_decay=false"
    " momentum=0.9"
    " seed=7 num_workers=1 log_every=1000 ";

struct Difference {
  std::size_t tensors = 0;
  std::size_t elements = 0;
  std::size_t differing = 0;  // elements whose bits differ
  double max_abs = 0;
};

// Compares every tensor of two parameter files bit by bit; the names, dtypes
// and shapes must match.
Difference compare(const fs::path& a, const fs::path& b) {
  const auto fa = dtrain::SafetensorsFile::open(a), fb = dtrain::SafetensorsFile::open(b);
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  BOOST_REQUIRE(sorted(fa.names()) == sorted(fb.names()));
  Difference d;
  for (const auto& name : fa.names()) {
    const auto ta = fa.tensor(name), tb = fb.tensor(name);
    BOOST_TEST_INFO("tensor " << name);
    BOOST_REQUIRE(ta.dtype == dtrain::element_type::f32);
    BOOST_REQUIRE(tb.dtype == dtrain::element_type::f32);
    BOOST_REQUIRE(ta.shape == tb.shape);
    const auto va = fa.read_f32(name), vb = fb.read_f32(name);
    for (std::size_t i = 0; i < va.size(); ++i) {
      if (std::memcmp(&va[i], &vb[i], sizeof(float)) != 0) ++d.differing;
      d.max_abs = std::max(d.max_abs, std::abs(static_cast<double>(va[i]) - vb[i]));
    }
    ++d.tensors;
    d.elements += va.size();
  }
  return d;
}

int run(const char* program, const std::string& args) {
  const int status = run_example(program, 2, job + args);
  if (status != 0) BOOST_TEST_MESSAGE(program << " " << args << " failed:\n" << last_log());
  return status;
}

}  // namespace

BOOST_AUTO_TEST_CASE(own_loop_ends_with_the_trainers_parameters) {
  struct Case {
    std::string strategy;
    int accumulate;
    std::string optimizer;
  };
  for (const Case& c :
       {Case{"ddp", 1, "adamw"}, Case{"ddp", 2, "sgd"}, Case{"zero1", 1, "adamw"}, Case{"zero1", 2, "sgd"}}) {
    const std::string args = " steps=15 strategy=" + c.strategy + " accumulate=" + std::to_string(c.accumulate) +
                             " optimizer=" + c.optimizer;
    BOOST_TEST_CONTEXT(args) {
      const std::string tag = c.strategy + "-" + std::to_string(c.accumulate) + "-" + c.optimizer;
      const auto trainer = scratch(tag + "-trainer.safetensors"), own = scratch(tag + "-own.safetensors");
      fs::remove(trainer);
      fs::remove(own);
      BOOST_REQUIRE_EQUAL(run(TRAIN_MLP_PATH, args + " save_params=" + trainer.string()), 0);
      BOOST_REQUIRE_EQUAL(run(OWN_LOOP_PATH, args + " save_params=" + own.string()), 0);
      const Difference d = compare(trainer, own);
      BOOST_TEST_MESSAGE(tag << ": " << d.tensors << " tensors, " << d.elements << " elements, " << d.differing
                             << " differ, max |difference| " << d.max_abs);
      BOOST_TEST(d.tensors == 6u);  // weight and bias of three Linear layers
      BOOST_TEST(d.elements == 12u * 600 + 600 + 600u * 500 + 500 + 500u * 5 + 5);
      BOOST_TEST(d.differing == 0u);
    }
  }
}

// The comparison above can tell jobs apart: one step fewer leaves every
// parameter tensor somewhere else.
BOOST_AUTO_TEST_CASE(one_step_fewer_gives_other_parameters) {
  const auto fifteen = scratch("ddp-15.safetensors"), fourteen = scratch("ddp-14.safetensors");
  BOOST_REQUIRE_EQUAL(run(OWN_LOOP_PATH, " steps=15 strategy=ddp save_params=" + fifteen.string()), 0);
  BOOST_REQUIRE_EQUAL(run(OWN_LOOP_PATH, " steps=14 strategy=ddp save_params=" + fourteen.string()), 0);
  const Difference d = compare(fifteen, fourteen);
  BOOST_TEST_MESSAGE("15 against 14 steps: " << d.differing << " of " << d.elements << " elements differ, max "
                                             << d.max_abs);
  BOOST_TEST(d.differing > d.elements / 2);
  BOOST_TEST(d.max_abs > 1e-4);
}

// What the loop does not implement is refused with a usage error naming the
// key, not trained differently.
BOOST_AUTO_TEST_CASE(keys_the_loop_does_not_implement_are_refused) {
  const std::pair<std::string, std::string> cases[] = {
      {"strategy=fsdp-full", "strategy = 'fsdp-full' is not implemented by own_loop"},
      {"precision=bf16", "precision is not implemented by own_loop"},
      {"clip=1", "clip is not implemented by own_loop"},
  };
  for (const auto& [arg, message] : cases) {
    BOOST_TEST_CONTEXT(arg) {
      BOOST_TEST(run_example(OWN_LOOP_PATH, 1, "steps=1 " + arg) == 2);
      BOOST_TEST(last_log().find(message) != std::string::npos, last_log());
    }
  }
}
