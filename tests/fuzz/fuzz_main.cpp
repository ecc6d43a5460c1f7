// libFuzzer entry point for the targets of targets.hpp, all in one binary;
// the environment variable DTRAIN_FUZZ_TARGET names the one a run fuzzes.
// Built and run by tests/fuzz/run_fuzz.sh with clang's
// -fsanitize=fuzzer,address,undefined.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz/targets.hpp"

namespace {

using Target = void (*)(std::span<const unsigned char>, const std::filesystem::path&);
Target target = nullptr;

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

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("DTRAIN_FUZZ_TARGET");
  for (const auto& t : dtrain::fuzz::targets)
    if (name && t.name == std::string_view(name)) target = t.run;
  if (!target) {
    std::fprintf(stderr, "DTRAIN_FUZZ_TARGET='%s' names no target; one of:", name ? name : "");
    for (const auto& t : dtrain::fuzz::targets) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  target(std::span<const unsigned char>(data, size), scratch());
  return 0;
}
