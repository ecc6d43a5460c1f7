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
#include "dtrain/core/macros.hpp"
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
  DTRAIN_DECL World(Layout layout, std::string master_addr, int master_port, CommOptions options = {},
                    std::shared_ptr<TcpStoreServer> server = nullptr);

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
  DTRAIN_DECL std::function<std::string(int)> rank_namer() const;

  // A key prefix unique to the n-th call on this rank. Every rank creates its
  // communicators in the same order, so the n-th communicator of each rank
  // meets the others under the same prefix.
  DTRAIN_DECL std::string next_prefix(std::string_view kind);

  // The ranks that pass the same `color` form a sub-world, ranked in the
  // order of their rank here; `name` labels it in errors ("<name>/<color>").
  // Collective: every rank of this world calls split, in the same order
  // relative to its other collective calls. Local rank and size stay those of
  // the process on its node (they choose its GPU).
  DTRAIN_DECL World split(int color, std::string_view name);

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
  DTRAIN_DECL void barrier(std::string_view tag);

 private:
  DTRAIN_DECL static void validate(const Layout& l);
  // A world of several ranks has a token, or was told to run without one.
  DTRAIN_DECL static void check_job_token_policy(const Layout& layout, const CommOptions& options);

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
DTRAIN_DECL std::vector<World> make_local_worlds(int n, CommOptions options = {});

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/comm/world.ipp"
#endif
