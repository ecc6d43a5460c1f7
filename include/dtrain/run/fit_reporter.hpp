#pragma once
// dtrain::fit's reporting (run/fit.hpp): progress lines, the metrics file and
// TensorBoard scalars, and the formatting they share.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/metrics/metric.hpp"
#include "dtrain/metrics/tensorboard.hpp"
#include "dtrain/run/fit_options.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain {

namespace detail {

DTRAIN_DECL std::string mib_text(std::size_t bytes);

// Every rank's step time and time waiting in collectives at one step, and
// the rank that computed longest (step minus wait) against the median rank.
struct Stragglers {
  std::vector<double> step_ms, wait_ms;
  int slowest = 0;
  double lag = 1;        // the slowest rank's compute time over the median rank's
  double excess_ms = 0;  // the slowest rank's compute time minus the median rank's
};

// "params 1.2 | grads ... MiB" for the first progress line.
DTRAIN_DECL std::string memory_text(const MemoryUsage& m);

DTRAIN_DECL std::string memory_json(const MemoryUsage& m);

DTRAIN_DECL std::string json_number(double v);

// Where fit writes what it measures, on rank 0: progress lines, the metrics
// file, TensorBoard.
class FitReporter {
 public:
  DTRAIN_DECL FitReporter(const FitOptions& o, bool rank0, bool resumed, std::int64_t first_step);

  DTRAIN_DECL void step(const StepStats& st, int world_size, std::string_view strategy, std::size_t params, bool last,
                        const Stragglers* lag = nullptr);

  // A rollback: the failed step, where training resumes, and why.
  DTRAIN_DECL void rollback(std::int64_t failed, std::int64_t resumed, const std::filesystem::path& from,
                            const std::string& why);

  DTRAIN_DECL void eval(std::int64_t step, const EvalResult& r);

  DTRAIN_DECL void line(const std::string& text);

 private:
  const FitOptions& o_;
  bool rank0_;
  bool shown_memory_ = false;
  std::ofstream metrics_;
  std::optional<TensorBoardWriter> tensorboard_;
};

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_reporter.ipp"
#endif
