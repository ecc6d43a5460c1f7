// dtrain_consumer: a project outside dtrain's source tree that uses only the
// installed package. It trains its own small model (with a unit it defines
// itself, consumer::Affine) for a few DDP steps on every rank it was launched
// with, and exits non-zero unless the loss went down:
//
//   dtrain-run --nproc-per-node 2 ./dtrain_consumer [steps]
//
// Built with CONSUMER_WITH_CUDA (train_cuda.cu compiled by nvcc), it trains on
// the GPUs when every local rank has one, and on the host otherwise.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "consumer.hpp"

#include <dtrain/version.hpp>

consumer::Losses consumer::train_host(dtrain::World& world, const dtrain::Dataset& data, std::int64_t steps) {
  return train<dtrain::Host>(world, data, steps);
}

int main(int argc, char** argv) {
  try {
    const std::int64_t steps = argc > 1 ? std::stoll(argv[1]) : 40;
    if (steps < 2) throw dtrain::config_error("steps must be at least 2", "pass a larger step count, e.g. 40");
    auto world = dtrain::init();
    const dtrain::Dataset data = consumer::make_dataset(4096, 0);

    bool on_gpu = false;
#if CONSUMER_WITH_CUDA
    on_gpu = consumer::cuda_device_count() >= world.local_size();
#endif
    if (world.rank() == 0)
      std::printf("dtrain %s, %d rank(s), training on %s\n", dtrain::version.data(), world.size(),
                  on_gpu ? "cuda" : "host");
#if CONSUMER_WITH_CUDA
    const auto losses = on_gpu ? consumer::train_cuda(world, data, steps) : consumer::train_host(world, data, steps);
#else
    const auto losses = consumer::train_host(world, data, steps);
#endif

    // The first loss is near chance, ln(3) = 1.10; 40 working steps reach
    // about 0.15, far below the bar of half the first loss, so only a broken
    // step fails it (10 steps, at about 0.7, do not clear it).
    const bool learned = losses.last < 0.5 * losses.first;
    if (world.rank() == 0)
      std::printf("loss %.4f -> %.4f: %s\n", losses.first, losses.last, learned ? "went down" : "DID NOT go down");
    return learned ? EXIT_SUCCESS : EXIT_FAILURE;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain_consumer: error: %s\n", e.what());
    dtrain::record_failure(e, EXIT_FAILURE);  // for dtrain-run: the first rank's error is the cause
    return EXIT_FAILURE;
  }
}
