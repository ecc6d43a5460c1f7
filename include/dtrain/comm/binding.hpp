#pragma once
// How a strategy reaches the communicator of its device: which communicator a
// device uses, and how a collective is ordered against the device's own work.
// Each backend specialises CommBinding for its device, beside its
// communicators (backend/<name>/comm_binding.hpp):
//
//   comm_type, work_type          the communicator and its completion handle
//   make(world, dev)              a communicator over `world`'s ranks (unique_ptr)
//   all_reduce(comm, dev, data, op), broadcast(comm, dev, data, root),
//   reduce_scatter(comm, dev, in, out, op), all_gather(comm, dev, in, out)
//                                 a collective on device memory, after the
//                                 device work queued so far
//   join(work, dev)               after it the device may read the result
//   ready(work)                   whether a collective that depends on `work`
//                                 can be issued without blocking the host
//   done(work)                    whether `work` has completed (joining is free)
//   then(work, next)              orders the collectives issued next on
//                                 communicator `next` after `work`
//   host_barrier(comm, dev)       blocks the calling thread until every rank got here
//   device_for(world)             (optional) the device index a rank computes on
//
// On the host, compute is synchronous, so a gradient slice is final when the
// unit's backward returns and the collective can start at once on the host
// communicator's progress thread. The CUDA binding instead orders NCCL on a
// communication stream behind an event of the compute stream.

#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/world.hpp"

namespace dtrain {

template <class Dev>
struct CommBinding {
  static_assert(sizeof(Dev) == 0,
                "dtrain: no communicator binding for this Device: include its backend (<dtrain/trainer.hpp> "
                "includes the built-in ones: Host, and Cuda where CUDA is found) or specialise "
                "dtrain::CommBinding<Dev>");
};

}  // namespace dtrain
