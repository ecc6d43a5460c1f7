// A rank program for the multi-process collective tests: joins the job from
// the launcher's environment, runs every collective for every dtype against
// exactly computable expectations, and exits non-zero on the first mismatch.
#include <dtrain/comm/host.hpp>
#include <dtrain/launch/init.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

// Small integers are exact in every dtype and in any summation order.
float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * (1 + static_cast<int>(i % 7))); }

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

template <class T>
void run_all(dtrain::GlooCommunicator& comm, const char* dtype) {
  const int n = comm.size(), me = comm.rank();
  const float rank_sum = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{4099}}) {
    const std::string tag = std::string(dtype) + " len " + std::to_string(len);
    std::vector<T> buf(len);
    for (std::size_t i = 0; i < len; ++i) buf[i] = T(value(me, i));
    comm.all_reduce(std::span<T>(buf), dtrain::reduce_op::sum).wait();
    for (std::size_t i = 0; i < len; ++i)
      expect(static_cast<float>(buf[i]) == rank_sum * (1 + static_cast<float>(i % 7)), "all_reduce " + tag);

    std::vector<T> in(len * static_cast<std::size_t>(n)), out(len);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = T(value(me, i));
    comm.reduce_scatter(std::span<const T>(in), std::span<T>(out), dtrain::reduce_op::sum).wait();
    for (std::size_t i = 0; i < len; ++i) {
      const std::size_t g = static_cast<std::size_t>(me) * len + i;
      expect(static_cast<float>(out[i]) == rank_sum * (1 + static_cast<float>(g % 7)), "reduce_scatter " + tag);
    }

    std::vector<T> mine(len), all(len * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < len; ++i) mine[i] = T(value(me, i));
    comm.all_gather(std::span<const T>(mine), std::span<T>(all)).wait();
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < len; ++i)
        expect(static_cast<float>(all[static_cast<std::size_t>(r) * len + i]) == value(r, i), "all_gather " + tag);

    std::vector<T> b(len);
    for (std::size_t i = 0; i < len; ++i) b[i] = T(value(me, i));
    comm.broadcast(std::span<T>(b), n - 1).wait();
    for (std::size_t i = 0; i < len; ++i) expect(static_cast<float>(b[i]) == value(n - 1, i), "broadcast " + tag);
  }
  comm.barrier().wait();
}

}  // namespace

int main() {
  try {
    auto world = dtrain::init();
    dtrain::GlooCommunicator comm(world);
    run_all<float>(comm, "fp32");
    run_all<dtrain::bf16>(comm, "bf16");
    run_all<dtrain::fp16>(comm, "fp16");
    std::printf("rank %d of %d: all collectives correct\n", world.rank(), world.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_child: %s\n", e.what());
    return 1;
  }
}
