// The definitions world.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <cstdio>

#include "dtrain/comm/world.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL World::World(Layout layout, std::string master_addr, int master_port, CommOptions options,
                           std::shared_ptr<TcpStoreServer> server)
      : state_(std::make_shared<State>()) {
    validate(layout);
    state_->layout = layout;
    state_->options = options;
    state_->global_ranks.resize(static_cast<std::size_t>(layout.size));
    for (int r = 0; r < layout.size; ++r) state_->global_ranks[static_cast<std::size_t>(r)] = r;
    if (layout.size > 1) check_job_token_policy(layout, options);
    if (!server && layout.rank == 0 && layout.size > 1)
      server = std::make_shared<TcpStoreServer>(
          master_port, options.store_bind.empty() ? detail::bind_address_of(master_addr) : options.store_bind,
          options.job_token);
    state_->server = std::move(server);
    if (layout.size > 1 || state_->server) {
      const int port = state_->server ? state_->server->port() : master_port;
      state_->store = std::make_shared<TcpStore>(master_addr, port, options.timeout, options.job_token);
      // Waits for this rank's keys fail as soon as it is gone (TcpStore::announce).
      if (layout.size > 1) state_->store->announce(layout.rank);
    }
  }

  DTRAIN_DECL auto World::check_job_token_policy(const Layout& layout, const CommOptions& options)->void {
    if (!options.job_token.empty()) {
      check_job_token(options.job_token, "the job token");
      return;
    }
    if (!options.insecure_no_token)
      throw launch_error(
          "rank " + std::to_string(layout.rank) + " of a " + std::to_string(layout.size) +
              "-rank job has no job token: without one, any process that reaches the rendezvous port could join "
              "the job",
          "launch with dtrain-run (it makes a token and passes it to every rank); with srun, torchrun or mpirun, "
          "export the same DTRAIN_JOB_TOKEN=$(dtrain-run --new-token) to every rank; or set "
          "DTRAIN_INSECURE_NO_TOKEN=1 to run unauthenticated (docs/security.md)");
    if (layout.rank == 0)
      std::fprintf(stderr,
                   "dtrain: WARNING: DTRAIN_INSECURE_NO_TOKEN=1: this job's rendezvous and its ranks' TCP "
                   "connections admit any process that reaches them (docs/security.md)\n");
  }

  DTRAIN_DECL auto World::rank_namer() const->std::function<std::string(int)> {
    return [in_group = !state_->group.empty(), globals = state_->global_ranks](int r) {
      if (!in_group) return std::to_string(r);
      return std::to_string(r) + " (global " + std::to_string(globals.at(static_cast<std::size_t>(r))) + ")";
    };
  }

  DTRAIN_DECL auto World::next_prefix(std::string_view kind)->std::string {
    return state_->prefix + std::string(kind) + "/" + std::to_string(state_->next_id++) + "/";
  }

  DTRAIN_DECL auto World::split(int color, std::string_view name)->World {
    if (color < 0)
      throw config_error(
          "World::split(" + std::to_string(color) + ", \"" + std::string(name) + "\"): the color must be >= 0",
          "give every rank a non-negative group number");
    const std::string base = next_prefix("split");
    const auto colors = all_gather(std::string(name) + "/color", color);
    World sub(*this);
    sub.state_ = std::make_shared<State>(*state_);
    auto& st = *sub.state_;
    st.global_ranks.clear();
    int my_index = 0;
    for (int r = 0; r < size(); ++r) {
      if (colors[static_cast<std::size_t>(r)] != color) continue;
      if (r == rank()) my_index = static_cast<int>(st.global_ranks.size());
      st.global_ranks.push_back(global_rank(r));
    }
    st.layout.rank = my_index;
    st.layout.size = static_cast<int>(st.global_ranks.size());
    st.group = std::string(name) + "/" + std::to_string(color);
    st.prefix = base + st.group + "/";
    st.next_id = 0;
    return sub;
  }

  DTRAIN_DECL auto World::barrier(std::string_view tag)->void {
    if (size() == 1) return;
    const std::string key = next_prefix("barrier") + std::string(tag);
    if (store()->add(key, 1) == size()) store()->set(key + "/done", "1");
    store()->get(key + "/done", std::nullopt, state_->global_ranks);  // the last to arrive sets it
  }

  DTRAIN_DECL auto World::validate(const Layout& l)->void {
    if (l.size < 1) throw launch_error("world size " + std::to_string(l.size) + " is not positive");
    if (l.rank < 0 || l.rank >= l.size)
      throw launch_error("rank " + std::to_string(l.rank) + " is outside the world of " + std::to_string(l.size),
                         "RANK must be in [0, WORLD_SIZE)");
    if (l.local_size < 1 || l.local_rank < 0 || l.local_rank >= l.local_size)
      throw launch_error("local rank " + std::to_string(l.local_rank) + " is outside the local world of " +
                             std::to_string(l.local_size),
                         "LOCAL_RANK must be in [0, LOCAL_WORLD_SIZE)");
  }

  DTRAIN_DECL std::vector<World> make_local_worlds(int n, CommOptions options) {
    // One process: a token of its own keeps other processes out of it.
    if (options.job_token.empty() && !options.insecure_no_token) options.job_token = new_job_token();
    auto server = std::make_shared<TcpStoreServer>(0, "127.0.0.1", options.job_token);
    std::vector<World> worlds;
    worlds.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      worlds.emplace_back(World::Layout{r, n, r, n, {}}, "127.0.0.1", server->port(), options, server);
    return worlds;
  }
}  // namespace dtrain
DTRAIN_IMPL_END
