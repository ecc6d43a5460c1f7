// The Conan package's smoke test: one process trains a linear classifier for a
// few steps through dtrain's Trainer (so the headers, Gloo and OpenBLAS all
// link and run) and fails unless the loss goes down.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <vector>

#include <dtrain/trainer.hpp>
#include <dtrain/version.hpp>

struct Classifier {
  dtrain::nn::Linear fc{4, 2};
  dtrain::nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(fc); }
};

int main() {
  try {
    auto world = dtrain::init();  // no launcher variables: a world of one
    Classifier model;
    dtrain::Trainer<Classifier> trainer{world, model, dtrain::SGD{.lr = 0.5f}};
    // Label = whether the first feature is positive: learnable by one Linear.
    std::vector<float> x;
    std::vector<std::int32_t> y;
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 4; ++c) x.push_back(static_cast<float>(((r + 1) * (c + 3)) % 7) - 3.f);
      y.push_back(x[static_cast<std::size_t>(r * 4)] > 0.f ? 1 : 0);
    }
    const auto batch = dtrain::Batch::table(x, y, 8, 4);
    double first = 0, last = 0;
    for (int s = 0; s < 10; ++s) {
      last = trainer.step(std::span(&batch, 1)).loss;
      if (s == 0) first = last;
    }
    std::printf("dtrain %s: loss %.4f -> %.4f\n", dtrain::version.data(), first, last);
    return last < first ? EXIT_SUCCESS : EXIT_FAILURE;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_package: %s\n", e.what());
    return EXIT_FAILURE;
  }
}
