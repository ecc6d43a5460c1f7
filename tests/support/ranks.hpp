#pragma once
// Test helpers: run a body on N ranks that are threads of this process, and
// float64 references with random non-zero inputs.

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/world.hpp>

namespace dtrain::testing {

// Boost.Test's assertions are not thread-safe: rank bodies use these, which
// throw, and run_ranks rethrows on the main thread.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

template <class E, class F>
void require_throws(F&& f) {
  try {
    f();
  } catch (const E&) {
    return;
  }
  throw std::runtime_error("expected an exception that was not thrown");
}

// Runs body(world) on n threads; rethrows the first exception any rank threw.
inline void run_ranks(int n, const std::function<void(World&)>& body, CommOptions options = {}) {
  auto worlds = make_local_worlds(n, options);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(worlds[static_cast<std::size_t>(r)]);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Random values in +-[0.5, 2): non-zero and well away from cancellation.
inline std::vector<double> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mag(0.5, 2.0);
  std::vector<double> v(n);
  for (auto& x : v) x = (gen() & 1 ? 1.0 : -1.0) * mag(gen);
  return v;
}

}  // namespace dtrain::testing
