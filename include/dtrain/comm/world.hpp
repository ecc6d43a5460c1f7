#pragma once
// A World is this process's place in the job: rank, size, local rank, and the
// rendezvous store every communicator bootstraps from. dtrain::init()
// (launch/init.hpp) builds one from the launcher's environment;
// make_local_worlds() builds N of them for ranks that are threads of one
// process (tests, dtrain-doctor). split() makes a sub-world (a group of
// ranks) from which communicators over just that group are built, with the
// same timeouts and errors as the whole world's.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/store.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/wire.hpp"

namespace dtrain {

class World {
 public:
  struct Layout {
    int rank = 0;
    int size = 1;
    int local_rank = 0;
    int local_size = 1;
    // Which node this process is on, beyond its host name: the launcher's
    // node index (GROUP_RANK, SLURM_NODEID). Two dtrain-run --nnodes 2 on
    // one machine are two nodes; threads of one process are one node.
    std::string node_tag;
  };

  // Joins the rendezvous at master_addr:master_port. Rank 0 hosts it unless a
  // server is handed in (threads sharing one process share one server).
  World(Layout layout, std::string master_addr, int master_port, CommOptions options = {},
        std::shared_ptr<TcpStoreServer> server = nullptr)
      : state_(std::make_shared<State>()) {
    validate(layout);
    state_->layout = layout;
    state_->options = options;
    state_->global_ranks.resize(static_cast<std::size_t>(layout.size));
    for (int r = 0; r < layout.size; ++r) state_->global_ranks[static_cast<std::size_t>(r)] = r;
    if (!server && layout.rank == 0 && layout.size > 1)
      server = std::make_shared<TcpStoreServer>(master_port);
    state_->server = std::move(server);
    if (layout.size > 1 || state_->server) {
      const int port = state_->server ? state_->server->port() : master_port;
      state_->store = std::make_shared<TcpStore>(master_addr, port, options.timeout);
      // Waits for this rank's keys fail as soon as it is gone (TcpStore::announce).
      if (layout.size > 1) state_->store->announce(layout.rank);
    }
  }

  int rank() const { return state_->layout.rank; }
  int size() const { return state_->layout.size; }
  int local_rank() const { return state_->layout.local_rank; }
  int local_size() const { return state_->layout.local_size; }
  const std::string& node_tag() const { return state_->layout.node_tag; }
  const CommOptions& options() const { return state_->options; }

  // The rendezvous store; null for a world of one that hosts none.
  const std::shared_ptr<TcpStore>& store() const { return state_->store; }

  // Rank r of this world in the whole job (the identity unless this is a group).
  int global_rank(int r) const { return state_->global_ranks.at(static_cast<std::size_t>(r)); }
  int global_rank() const { return global_rank(rank()); }
  // "" for the whole job, else the group's name, e.g. "shard/1".
  const std::string& group() const { return state_->group; }

  // "3" in the whole job; "1 (global 3)" in a group: how errors name rank r.
  std::string describe_rank(int r) const { return rank_namer()(r); }
  // The same naming as a self-contained callable (communicators keep one).
  std::function<std::string(int)> rank_namer() const {
    return [in_group = !state_->group.empty(), globals = state_->global_ranks](int r) {
      if (!in_group) return std::to_string(r);
      return std::to_string(r) + " (global " + std::to_string(globals.at(static_cast<std::size_t>(r))) + ")";
    };
  }

  // A key prefix unique to the n-th call on this rank. Every rank creates its
  // communicators in the same order, so the n-th communicator of each rank
  // meets the others under the same prefix.
  std::string next_prefix(std::string_view kind) {
    return state_->prefix + std::string(kind) + "/" + std::to_string(state_->next_id++) + "/";
  }

  // The ranks that pass the same `color` form a sub-world, ranked in the
  // order of their rank here; `name` labels it in errors ("<name>/<color>").
  // Collective: every rank of this world calls split, in the same order
  // relative to its other collective calls. Local rank and size stay those of
  // the process on its node (they choose its GPU).
  World split(int color, std::string_view name) {
    if (color < 0)
      throw config_error("World::split(" + std::to_string(color) + ", \"" + std::string(name) +
                             "\"): the color must be >= 0",
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

  // Every rank contributes `mine`; every rank gets all values by rank. Any
  // WireValue (core/wire.hpp): a trivially copyable value, a string, a
  // vector, or a struct with wire_fields(). Collective; `key` labels it in
  // errors (a rank that never arrives is named by the store).
  template <WireValue T>
  std::vector<T> all_gather(std::string_view key, const T& mine) {
    if (size() == 1) return {mine};
    const std::string base = next_prefix("gather") + std::string(key) + "/";
    store()->set(base + std::to_string(rank()), wire::encode(mine));
    std::vector<T> all(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      const int setter = global_rank(r);
      all[static_cast<std::size_t>(r)] =
          wire::decode<T>(store()->get(base + std::to_string(r), std::nullopt, std::span(&setter, 1)));
    }
    return all;
  }

  // Fails on every rank, naming the first rank that differs from rank 0 and
  // where (the field, or the element of a list), when ranks hold different
  // values of `what`: a model signature, the seed, a sampler position.
  template <WireValue T>
  void agree(std::string_view what, const T& mine,
             std::string_view fix = "every rank must run the same program with the same configuration") {
    const std::vector<T> all = all_gather(what, mine);
    for (int r = 1; r < size(); ++r)
      if (const auto d = wire::first_difference(all[0], all[static_cast<std::size_t>(r)])) {
        std::string msg = "ranks disagree on " + std::string(what) + ": rank " + describe_rank(r) + " has ";
        if (!d->where.empty()) msg += d->where + " = ";
        msg += d->b + " where rank 0 has " + d->a;
        throw config_error(msg, std::string(fix));
      }
  }

  // A store-based barrier, for bootstrap (communicators have their own).
  void barrier(std::string_view tag) {
    if (size() == 1) return;
    const std::string key = next_prefix("barrier") + std::string(tag);
    if (store()->add(key, 1) == size()) store()->set(key + "/done", "1");
    store()->get(key + "/done", std::nullopt, state_->global_ranks);  // the last to arrive sets it
  }

 private:
  static void validate(const Layout& l) {
    if (l.size < 1) throw launch_error("world size " + std::to_string(l.size) + " is not positive");
    if (l.rank < 0 || l.rank >= l.size)
      throw launch_error("rank " + std::to_string(l.rank) + " is outside the world of " + std::to_string(l.size),
                         "RANK must be in [0, WORLD_SIZE)");
    if (l.local_size < 1 || l.local_rank < 0 || l.local_rank >= l.local_size)
      throw launch_error("local rank " + std::to_string(l.local_rank) + " is outside the local world of " +
                             std::to_string(l.local_size),
                         "LOCAL_RANK must be in [0, LOCAL_WORLD_SIZE)");
  }

  struct State {
    Layout layout;
    CommOptions options;
    std::shared_ptr<TcpStoreServer> server;
    std::shared_ptr<TcpStore> store;
    std::uint64_t next_id = 0;
    std::string prefix;             // a group's keys live under it; "" for the whole job
    std::string group;              // "" for the whole job
    std::vector<int> global_ranks;  // this world's rank r is global rank global_ranks[r]
  };
  std::shared_ptr<State> state_;
};

// N worlds whose ranks are threads of this process, sharing one loopback
// rendezvous server. Hand world r to thread r.
inline std::vector<World> make_local_worlds(int n, CommOptions options = {}) {
  auto server = std::make_shared<TcpStoreServer>(0, "127.0.0.1");
  std::vector<World> worlds;
  worlds.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) worlds.emplace_back(World::Layout{r, n, r, n, {}}, "127.0.0.1", server->port(), options, server);
  return worlds;
}

}  // namespace dtrain
