// A rank program for the multi-process collective tests: joins the job from
// the launcher's environment and, by --mode:
//   check     (default) runs every collective for every dtype against exactly
//             computable expectations; exits non-zero on the first mismatch;
//             --expect NAME also requires HostCommunicator::transport() == NAME
//   die       rank 1 kills itself (SIGKILL) after one collective; the others
//             must detect it in their next one
//   throw     rank 1 throws after one collective (its communicator unwinds)
//   mismatch  rank 0 all-reduces 10 elements, the others 12
//   hold      one collective, prints "ready", then sleeps until killed
//   leak      creates /dev/shm/dtrain-$DTRAIN_JOB_ID-leak and kills itself:
//             what dtrain-run must clean up
// Exit codes: 0 success, 3 the expected failure was detected (the message is
// printed), 1 anything else.
#include <fcntl.h>
#include <sys/mman.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/backend/host/comm.hpp>
#include <dtrain/launch/init.hpp>

namespace {

// Small integers are exact in every dtype and in any summation order.
float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * (1 + static_cast<int>(i % 7))); }

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

template <class T>
void run_all(dtrain::HostCommunicator& comm, const char* dtype) {
  const int n = comm.size(), me = comm.rank();
  const float rank_sum = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{4099}, std::size_t{200003}}) {
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

// Runs a collective that must fail because of the scenario; exit code 3 and
// the message when it does.
template <class F>
int expect_failure(F&& f, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const dtrain::comm_error& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    std::printf("detected %s after %lld ms: %s\n", what, static_cast<long long>(ms), e.what());
    std::fflush(stdout);
    return 3;
  }
  std::fprintf(stderr, "comm_child: %s was not detected\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "check", expect;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
    if (std::strcmp(argv[i], "--expect") == 0) expect = argv[i + 1];
  }
  try {
    if (mode == "leak") {
      const std::string name = "/dtrain-" + std::string(std::getenv("DTRAIN_JOB_ID")) + "-leak";
      const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
      if (fd < 0) return 1;
      ::raise(SIGKILL);
    }
    auto world = dtrain::init();
    dtrain::HostCommunicator comm(world);
    if (!expect.empty() && comm.transport() != expect) {
      std::fprintf(stderr, "comm_child: transport is %s, expected %s\n", comm.description().c_str(), expect.c_str());
      return 1;
    }
    const int me = world.rank();
    std::vector<float> x(100000, 1.f);
    if (mode == "check") {
      run_all<float>(comm, "fp32");
      run_all<dtrain::bf16>(comm, "bf16");
      run_all<dtrain::fp16>(comm, "fp16");
      std::printf("rank %d of %d: all collectives correct over %s\n", me, world.size(), comm.description().c_str());
      return 0;
    }
    if (mode == "mismatch") {
      std::vector<float> y(me == 0 ? 10 : 12, 1.f);
      return expect_failure([&] { comm.all_reduce(std::span<float>(y), dtrain::reduce_op::sum).wait(); },
                            "a mismatched call");
    }
    comm.all_reduce(std::span<float>(x), dtrain::reduce_op::sum).wait();
    if (mode == "hold") {
      std::printf("ready\n");
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (mode == "die" && me == 1) ::raise(SIGKILL);
    if (mode == "throw" && me == 1) throw std::runtime_error("rank 1 fails on purpose");
    return expect_failure([&] { comm.all_reduce(std::span<float>(x), dtrain::reduce_op::sum).wait(); }, "a lost peer");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_child: %s\n", e.what());
    return 1;
  }
}
