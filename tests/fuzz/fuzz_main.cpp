// libFuzzer entry point for one target of targets.hpp, chosen at build time
// (-DDTRAIN_FUZZ_TARGET=safetensors|checkpoint_index|config). Built and run
// by tests/fuzz/run_fuzz.sh with clang's -fsanitize=fuzzer,address,undefined.

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "fuzz/targets.hpp"

namespace {

const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    // tmpfs when there is one: every input is written to a file and mapped.
    const char* base = std::getenv("DTRAIN_FUZZ_SCRATCH");
    const char* fallback = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::filesystem::path d = std::filesystem::path(base ? base : fallback) / "dtrain-fuzz-";
    d += std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  dtrain::fuzz::DTRAIN_FUZZ_TARGET(std::span<const unsigned char>(data, size), scratch());
  return 0;
}
