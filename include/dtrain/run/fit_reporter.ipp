// The definitions fit_reporter.hpp declares with DTRAIN_DECL: included at
// the end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they
// are compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ios>
#include <system_error>

#include "dtrain/core/error.hpp"
#include "dtrain/run/fit_reporter.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::string mib_text(std::size_t bytes) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f", static_cast<double>(bytes) / (1 << 20));
    return t;
  }

  DTRAIN_DECL std::string memory_text(const MemoryUsage& m) {
    return "params " + mib_text(m.params) + " | grads " + mib_text(m.grads) + " | optimizer " + mib_text(m.optimizer) +
           " | master " + mib_text(m.master) + " | gathered " + mib_text(m.gathered) + " | activations " +
           mib_text(m.activations) + " | total " + mib_text(m.total()) + " MiB";
  }

  DTRAIN_DECL std::string memory_json(const MemoryUsage& m) {
    return "{\"params\": " + std::to_string(m.params) + ", \"grads\": " + std::to_string(m.grads) +
           ", \"optimizer\": " + std::to_string(m.optimizer) + ", \"master\": " + std::to_string(m.master) +
           ", \"gathered\": " + std::to_string(m.gathered) + ", \"activations\": " + std::to_string(m.activations) +
           "}";
  }

  DTRAIN_DECL std::string json_number(double v) {
    if (!std::isfinite(v)) return "null";  // JSON has no NaN or infinity
    char t[40];
    std::snprintf(t, sizeof t, "%.10g", v);
    return t;
  }

  DTRAIN_DECL FitReporter::FitReporter(const FitOptions& o, bool rank0, bool resumed, std::int64_t first_step)
      : o_(o), rank0_(rank0) {
    if (!rank0_) return;
    // The events file first: it is a new file, while opening the metrics
    // file may truncate one, so a bad tensorboard_dir leaves that as it was.
    if (!o.tensorboard_dir.empty()) {
      try {
        tensorboard_.emplace(o.tensorboard_dir);
      } catch (const error& e) {
        throw config_error(e.problem(), e.fix(), e.where());
      }
    }
    if (!o.metrics_file.empty()) {
      std::error_code ignored;  // a failure shows as the open's below
      if (o.metrics_file.has_parent_path()) std::filesystem::create_directories(o.metrics_file.parent_path(), ignored);
      // A resumed run appends: the records before the restart stay.
      metrics_.open(o.metrics_file, resumed ? std::ios::app : std::ios::trunc);
      if (!metrics_)
        throw config_error("cannot write the metrics file '" + o.metrics_file.string() + "'",
                           "check that its folder exists and is writable");
    }
    // TensorBoard drops what earlier files in the folder hold from this
    // step on: a killed attempt's, an earlier run's into the same folder.
    if (tensorboard_) tensorboard_->write_session_start(first_step + 1);
  }

  DTRAIN_DECL auto FitReporter::step(const StepStats& st, int world_size, std::string_view strategy, std::size_t params,
                                     bool last, const Stragglers* lag) -> void {
    if (!rank0_) return;
    const double seconds = st.step_ms / 1000.0;
    const double sps = st.samples / seconds, tps = st.positions / seconds;
    if (metrics_.is_open()) {
      metrics_ << "{\"step\": " << st.step << ", \"loss\": " << json_number(st.loss)
               << ", \"lr\": " << json_number(st.lr) << ", \"grad_norm\": " << json_number(st.grad_norm)
               << ", \"samples_per_s\": " << json_number(sps) << ", \"tokens_per_s\": " << json_number(tps)
               << ", \"step_ms\": " << json_number(st.step_ms) << ", \"world_size\": " << world_size
               << ", \"loss_scale\": " << json_number(st.loss_scale)
               << ", \"skipped\": " << (st.skipped ? "true" : "false") << ", \"memory\": " << memory_json(st.memory);
      if (st.host_memory.total() != 0) metrics_ << ", \"host_memory\": " << memory_json(st.host_memory);
      for (const auto& m : st.metrics) metrics_ << ", \"" << m.name << "\": " << json_number(m.value);
      if (lag) {
        const auto list = [](const std::vector<double>& v) {
          std::string out = "[";
          for (std::size_t i = 0; i < v.size(); ++i) out.append(i ? ", " : "").append(json_number(v[i]));
          return out + "]";
        };
        metrics_ << ", \"rank_step_ms\": " << list(lag->step_ms) << ", \"rank_wait_ms\": " << list(lag->wait_ms)
                 << ", \"slowest_rank\": " << lag->slowest << ", \"slowest_lag\": " << json_number(lag->lag);
      }
      metrics_ << "}\n";
      metrics_.flush();
    }
    if (tensorboard_) {
      const MemoryUsage& m = st.memory;
      const auto b = [](std::size_t v) { return static_cast<double>(v); };
      tensorboard_->write_scalars(st.step, {{"train/loss", st.loss},
                                            {"train/lr", st.lr},
                                            {"train/grad_norm", st.grad_norm},
                                            {"train/loss_scale", st.loss_scale},
                                            {"perf/samples_per_s", sps},
                                            {"perf/tokens_per_s", tps},
                                            {"perf/step_ms", st.step_ms},
                                            {"memory/params_bytes", b(m.params)},
                                            {"memory/grads_bytes", b(m.grads)},
                                            {"memory/optimizer_bytes", b(m.optimizer)},
                                            {"memory/master_bytes", b(m.master)},
                                            {"memory/gathered_bytes", b(m.gathered)},
                                            {"memory/activations_bytes", b(m.activations)}});
      if (!st.metrics.empty()) {
        std::vector<std::string> tags;  // the scalars' tags point here
        for (const auto& m : st.metrics) tags.push_back("train/" + m.name);
        std::vector<TensorBoardScalar> scalars;
        for (std::size_t i = 0; i < tags.size(); ++i) scalars.push_back({tags[i], st.metrics[i].value});
        tensorboard_->write_scalars(st.step, scalars);
      }
      if (const MemoryUsage& h = st.host_memory; h.total() != 0)
        tensorboard_->write_scalars(st.step, {{"host_memory/params_bytes", b(h.params)},
                                              {"host_memory/grads_bytes", b(h.grads)},
                                              {"host_memory/optimizer_bytes", b(h.optimizer)},
                                              {"host_memory/master_bytes", b(h.master)}});
    }
    if (!o_.progress) return;
    if (!shown_memory_) {
      shown_memory_ = true;
      std::printf("memory per rank (%.*s, rank 0): %s\n", static_cast<int>(strategy.size()), strategy.data(),
                  memory_text(st.memory).c_str());
      if (st.host_memory.total() != 0)
        std::printf("offloaded to host memory (rank 0): %s\n", memory_text(st.host_memory).c_str());
    }
    if (st.step != 1 && st.step % o_.log_every != 0 && !last) return;
    std::printf("step %5lld/%lld | loss %.4f | lr %.2e | %8.0f samples/s | step %7.2f ms | scale %g%s",
                static_cast<long long>(st.step), static_cast<long long>(o_.steps), st.loss, st.lr, sps, st.step_ms,
                st.loss_scale, st.skipped ? " | skipped (inf/nan)" : "");
    for (const auto& m : st.metrics)
      if (m.logged) std::printf(" | %s %.4f", (m.label.empty() ? m.name : m.label).c_str(), m.value);
    if (st.positions != st.samples) std::printf(" | %9.0f tokens/s", tps);
    if (o_.peak_tflops > 0) {
      // The usual estimate of training FLOPs: 6 per parameter and token (2
      // forward, 4 backward), attention's own products left out.
      const double tflops = 6.0 * static_cast<double>(params) * tps / world_size / 1e12;
      std::printf(" | %.2f TFLOP/s/rank | MFU %.1f%%", tflops, 100.0 * tflops / o_.peak_tflops);
    }
    // Named when it computes straggler_factor x the median's and that costs
    // the step a tenth of its time and a millisecond or more (noise on short
    // steps is not news).
    if (lag && lag->lag >= o_.straggler_factor && lag->excess_ms >= std::max(1.0, 0.1 * st.step_ms))
      std::printf(" | slow: rank %d computes %.1fx the median rank's time", lag->slowest, lag->lag);
    std::printf("\n");
    std::fflush(stdout);
  }

  DTRAIN_DECL auto FitReporter::rollback(std::int64_t failed, std::int64_t resumed, const std::filesystem::path& from,
                                         const std::string& why) -> void {
    if (!rank0_) return;
    if (metrics_.is_open()) {
      metrics_ << "{\"step\": " << failed << ", \"rollback_to\": " << resumed << ", \"skipped_step\": " << failed
               << "}\n";
      metrics_.flush();
    }
    line("non-finite step " + std::to_string(failed) + ": rolled back to " + from.string() + " (step " +
         std::to_string(resumed) + "); its batches will be skipped. " + why);
  }

  DTRAIN_DECL auto FitReporter::eval(std::int64_t step, const EvalResult& r) -> void {
    if (!rank0_) return;
    if (metrics_.is_open()) {
      metrics_ << "{\"step\": " << step << ", \"eval/loss\": " << json_number(r.loss)
               << ", \"eval/perplexity\": " << json_number(r.perplexity());
      for (const auto& [name, v] : r.metrics) metrics_ << ", \"eval/" << name << "\": " << json_number(v);
      metrics_ << "}\n";
      metrics_.flush();
    }
    if (tensorboard_) {
      std::vector<std::string> tags;  // the scalars' tags point here
      for (const auto& [name, v] : r.metrics) tags.push_back("eval/" + name);
      std::vector<TensorBoardScalar> scalars{{"eval/loss", r.loss}, {"eval/perplexity", r.perplexity()}};
      std::size_t k = 0;
      for (const auto& [name, v] : r.metrics) scalars.push_back({tags[k++], v});
      tensorboard_->write_scalars(step, scalars);
    }
    if (!o_.progress) return;
    std::printf("eval  %5lld | loss %.4f | perplexity %.2f", static_cast<long long>(step), r.loss, r.perplexity());
    for (const auto& [name, v] : r.metrics) std::printf(" | %s %.4f", name.c_str(), v);
    std::printf("\n");
    std::fflush(stdout);
  }

  DTRAIN_DECL auto FitReporter::line(const std::string& text) -> void {
    if (!rank0_ || !o_.progress) return;
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
  }  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
