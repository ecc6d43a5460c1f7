// The definitions fit_resume.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <algorithm>
#include <cstdio>

#include "dtrain/core/error.hpp"
#include "dtrain/run/fit_resume.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL Resumer::Resumer(const FitOptions& o, bool rank0) : o_(o), rank0_(rank0) {
    if (o.resume == "latest") {
      candidates_ = list_checkpoints(o.checkpoint_dir);
      std::ranges::reverse(candidates_);
    } else if (!o.resume.empty()) {
      candidates_.emplace_back(o.resume);
    }
  }

  DTRAIN_DECL std::optional<std::filesystem::path> Resumer::resume(const Load& load) const {
    for (std::size_t i = 0; i < candidates_.size(); ++i) {
      try {
        const CheckpointInfo info = load(candidates_[i]);
        if (rank0_ && o_.progress)
          std::printf("resumed from %s at step %lld (saved by %d rank(s), strategy %s)\n", candidates_[i].c_str(),
                      static_cast<long long>(info.step), info.world_size, info.strategy.c_str());
        return candidates_[i];
      } catch (const checkpoint_error& e) {
        if (i + 1 == candidates_.size()) throw;
        if (rank0_) std::printf("resume: skipping %s: %s\n", candidates_[i].c_str(), e.what());
      }
    }
    if (o_.resume == "latest" && rank0_ && o_.progress)
      std::printf("resume=latest: no checkpoint in %s yet: starting from step 0\n", o_.checkpoint_dir.c_str());
    return std::nullopt;
  }
  }  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
