// The definitions host_env.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/core/host_env.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::optional<int> env_count(const EnvLookup& env, const std::string& name, const std::string& fix) {
    auto text = env(name);
    if (!text) return std::nullopt;
    auto value = parse_integer(*text);
    if (!value) throw env_error(name + "='" + *text + "' is not an integer", fix);
    if (*value < 0) throw env_error(name + "=" + *text + " is negative", fix);
    if (*value > std::numeric_limits<int>::max()) throw env_error(name + "=" + *text + " is too large", fix);
    return static_cast<int>(*value);
  }

  DTRAIN_DECL std::vector<int> expand_slurm_counts(const std::string& name, const std::string& text) {
    const std::string fix = "this variable is set by Slurm; unset it or run the program with srun";
    std::vector<int> counts;
    std::string_view rest = text;
    while (true) {
      auto comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      int repeat = 1;
      if (auto open = item.find("(x"); open != std::string_view::npos) {
        auto times = item.back() == ')' ? parse_integer(item.substr(open + 2, item.size() - open - 3)) : std::nullopt;
        // Bounded: the list is expanded, and no cluster has a million nodes.
        if (!times || *times < 1 || *times > 1'000'000)
          throw env_error(name + "='" + text + "' has a malformed repeat count", fix);
        repeat = static_cast<int>(*times);
        item = item.substr(0, open);
      }
      auto count = parse_integer(item);
      if (!count || *count < 1 || *count > std::numeric_limits<int>::max())
        throw env_error(name + "='" + text + "' is not a list of task counts like 4(x2),3", fix);
      counts.insert(counts.end(), static_cast<std::size_t>(repeat), static_cast<int>(*count));
      if (comma == std::string_view::npos) return counts;
      rest.remove_prefix(comma + 1);
    }
  }

  DTRAIN_DECL bool launched_by(const EnvLookup& env, const RankVars& v) {
    if (&v == &slurm_vars) return env(v.rank).has_value();
    for (const char* name : {v.rank, v.size, v.local_rank, v.local_size})
      if (env(name)) return true;
    return false;
  }

  DTRAIN_DECL int slurm_local_size(const EnvLookup& env) {
    auto node = env_count(env, "SLURM_NODEID", slurm_vars.fix).value_or(0);
    for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}) {
      auto text = env(name);
      if (!text) continue;
      auto counts = expand_slurm_counts(name, *text);
      if (counts.size() == 1) return counts.front();
      if (static_cast<std::size_t>(node) >= counts.size())
        throw env_error("SLURM_NODEID=" + std::to_string(node) + " has no entry in " + name + "='" + *text + "'",
                        slurm_vars.fix);
      return counts[static_cast<std::size_t>(node)];
    }
    throw env_error(
        "SLURM_PROCID is set but none of SLURM_STEP_TASKS_PER_NODE, "
        "SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE is",
        slurm_vars.fix);
  }

  DTRAIN_DECL void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();  // _mm_pause without <immintrin.h>'s 38,000 lines in every translation unit
#elif defined(__aarch64__)
    asm volatile("yield");
#else
    std::this_thread::yield();
#endif
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (!value) return std::nullopt;
  return std::string(value);
}

DTRAIN_DECL int local_world_size(const EnvLookup& env) {
  for (const auto* v : {&detail::torchrun_vars, &detail::openmpi_vars, &detail::slurm_vars}) {
    if (!detail::launched_by(env, *v)) continue;
    const int n =
        v->local_size ? detail::env_count(env, v->local_size, v->fix).value_or(1) : detail::slurm_local_size(env);
    if (n < 1)
      throw env_error(std::string(v->local_size ? v->local_size : "this node's Slurm task count") + "=" +
                          std::to_string(n) + ": a node runs at least one rank",
                      v->fix);
    return n;
  }
  return 1;
}

DTRAIN_DECL int usable_cpu_count() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

DTRAIN_DECL int cores_per_local_rank(const EnvLookup& env) {
  return std::max(1, usable_cpu_count() / local_world_size(env));
}

DTRAIN_DECL std::optional<std::uint64_t> address_space_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<std::uint64_t>(limit.rlim_cur);
}

DTRAIN_DECL int blas_threads_within(std::uint64_t limit_bytes) {
  const std::uint64_t n = limit_bytes / 4 / blas_thread_address_space;
  return static_cast<int>(std::clamp<std::uint64_t>(n, 1, std::numeric_limits<int>::max()));
}

DTRAIN_DECL int blas_threads_capped(int threads, std::optional<std::uint64_t> limit_bytes) {
  return limit_bytes ? std::min(threads, blas_threads_within(*limit_bytes)) : threads;
}
}  // namespace dtrain
DTRAIN_IMPL_END
