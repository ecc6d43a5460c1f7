#pragma once
// The host binding of a strategy to its communicator (comm/binding.hpp says
// what a binding provides): HostCommunicator, whose progress thread runs
// the collectives in issue order. Host compute is synchronous, so a
// gradient slice is final when the unit's backward returns and its
// collective starts at once (shared memory within a node, Gloo across).

#include <memory>
#include <span>

#include "dtrain/backend/host/comm.hpp"
#include "dtrain/backend/host/device.hpp"
#include "dtrain/comm/binding.hpp"
#include "dtrain/comm/world.hpp"

namespace dtrain {

template <>
struct CommBinding<Host> {
  using comm_type = HostCommunicator;
  using work_type = HostWork;

  static std::unique_ptr<comm_type> make(World& world, Host&) { return std::make_unique<comm_type>(world); }

  template <class T>
  static work_type all_reduce(comm_type& comm, Host&, std::span<T> data, reduce_op op) {
    return comm.all_reduce(data, op);
  }
  template <class T>
  static work_type broadcast(comm_type& comm, Host&, std::span<T> data, int root) {
    return comm.broadcast(data, root);
  }
  template <class T>
  static work_type reduce_scatter(comm_type& comm, Host&, std::span<const T> in, std::span<T> out, reduce_op op) {
    return comm.reduce_scatter(in, out, op);
  }
  template <class T>
  static work_type all_gather(comm_type& comm, Host&, std::span<const T> in, std::span<T> out) {
    return comm.all_gather(in, out);
  }
  // After join() the device may read the collective's result.
  static void join(work_type& work, Host&) { work.wait(); }
  // Whether a collective that depends on `work` can be issued without
  // blocking the host (on CUDA always: events order the streams).
  static bool ready(const work_type& work) { return work.done(); }
  // Whether `work` has completed, so joining it costs nothing.
  static bool done(const work_type& work) { return work.done(); }
  // Orders the collectives issued next on `next` after `work` (on the host
  // by waiting for it; callers poll ready() first, so this does not block).
  static void then(work_type& work, comm_type&) { work.wait(); }
  // Blocks the calling thread until every rank got here.
  static void host_barrier(comm_type& comm, Host&) { comm.barrier().wait(); }
};

}  // namespace dtrain
