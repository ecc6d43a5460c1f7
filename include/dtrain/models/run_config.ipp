// The definitions run_config.hpp declares with DTRAIN_DECL (core/macros.hpp).
#pragma once

#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/models/run_config.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::models {
  DTRAIN_DECL TrainerOptions trainer_options(const RunConfig& c) {
    TrainerOptions o;
    // offload=nvme:DIR: the optimizer state offloaded, in files in DIR.
    if (c.offload.starts_with("nvme:")) {
      o.offload = offload_kind::optimizer;
      o.offload_dir = c.offload.substr(5);
      if (o.offload_dir.empty())
        throw config_error("offload=nvme: names no directory", "write offload=nvme:DIR, DIR on a local disk");
    } else {
      o.offload = parse_offload(c.offload);
    }
    o.seed = c.seed;
    o.clip.max_norm = c.clip;
    // rollback is dtrain::fit's (FitOptions::on_nonfinite): the Trainer stops on the step, fit rolls back.
    o.on_nonfinite = c.on_nonfinite == nonfinite_policy::skip ? nonfinite_policy::skip : nonfinite_policy::stop;
    o.lr_scaling = c.lr_scaling == "linear" ? lr_scaling_rule::linear
                   : c.lr_scaling == "sqrt" ? lr_scaling_rule::sqrt
                                            : lr_scaling_rule::none;
    const bool has_end = c.schedule == "cosine" || c.schedule == "linear";
    o.schedule =
        make_schedule(c.schedule, {.lr = c.lr, .warmup_steps = c.warmup_steps, .total_steps = has_end ? c.steps : 0});
    if (c.no_decay && c.weight_decay > 0) o.param_groups = {no_decay_group()};
    o.activation_checkpointing = c.activation_checkpointing;
    if (c.checkpoint_every < 1)
      throw config_error("checkpoint_every=" + std::to_string(c.checkpoint_every) + " is below 1",
                         "give 1 (every unit) or more");
    o.checkpoint_every = static_cast<std::size_t>(c.checkpoint_every);
    for (const auto u : c.checkpoint_units) {
      if (u < 0) throw config_error("checkpoint_units names unit " + std::to_string(u), "give unit numbers >= 0");
      o.checkpoint_units.push_back(static_cast<std::size_t>(u));
    }
    if (!(c.checkpoint_budget_mib >= 0))
      throw config_error("checkpoint_budget_mib=" + std::to_string(c.checkpoint_budget_mib) + " is negative",
                         "give a budget in MiB, or 0 for none");
    o.checkpoint_budget_bytes = static_cast<std::size_t>(c.checkpoint_budget_mib * 1024.0 * 1024.0);
    if (c.checkpoint_budget_mib > 0 && o.checkpoint_budget_bytes == 0) o.checkpoint_budget_bytes = 1;
    if (!c.activation_checkpointing &&
        (c.checkpoint_every != 1 || !c.checkpoint_units.empty() || c.checkpoint_budget_mib != 0))
      throw config_error(
          "checkpoint_every/checkpoint_units/checkpoint_budget_mib without "
          "activation_checkpointing=true",
          "add activation_checkpointing=true");
    return o;
  }

}  // namespace dtrain::models

DTRAIN_IMPL_END
