// NcclCommunicator against a float64 reference: every collective, dtype and
// reduction, at a world of one (one GPU) and, where the machine has several
// GPUs, with one thread per GPU. Checks run in the rank threads and return
// their failures as text: Boost.Test assertions are not thread-safe.
#include "support/gpu_main.hpp"
// gpu_main.hpp first: it sets Boost.Test up for its own main() before anything includes Boost.Test.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/backend/cuda/comm_nccl.hpp>

namespace {

using namespace dtrain;

static_assert(nccl_dtype_v<float> == ncclFloat32 && nccl_dtype_v<bf16> == ncclBfloat16 &&
              nccl_dtype_v<fp16> == ncclFloat16 && nccl_dtype_v<const float> == ncclFloat32);
static_assert(nccl_op(reduce_op::sum) == ncclSum && nccl_op(reduce_op::avg) == ncclAvg);

// Odd lengths on purpose: NCCL splits buffers into chunks and the tail of a
// length that divides nothing is where slicing bugs hide.
const std::vector<std::size_t> lengths = {0, 1, 7, 1023, 4099, 65539};

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n_) cuda_check(cudaMalloc(&data_, n_ * sizeof(T)), "cudaMalloc");
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }

  std::span<T> span() { return {data_, n_}; }
  std::span<const T> cspan() const { return {data_, n_}; }
  void upload(const std::vector<T>& host) {
    if (n_) cuda_check(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
    // The communicator's stream does not synchronise with the legacy stream
    // cudaMemcpy uses; make the copy complete before any collective reads it.
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) cuda_check(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t n_;
};

// Rank r's input for case `tag`: every rank can regenerate every other rank's.
template <class T>
std::vector<T> input(int rank, int tag, std::size_t n) {
  std::mt19937_64 gen(static_cast<std::uint64_t>(rank) * 1000003u + static_cast<std::uint64_t>(tag) * 7919u + n);
  std::uniform_real_distribution<float> mag(0.5f, 2.0f);
  std::vector<T> v(n);
  for (auto& x : v) x = T((gen() & 1 ? 1.f : -1.f) * mag(gen));
  return v;
}

template <class T>
std::vector<std::vector<T>> inputs(int size, int tag, std::size_t n) {
  std::vector<std::vector<T>> all;
  for (int r = 0; r < size; ++r) all.push_back(input<T>(r, tag, n));
  return all;
}

// Collects the first mismatch of each check, naming rank, case and element.
class Failures {
 public:
  explicit Failures(int rank) : rank_(rank) {}

  template <class T>
  void close(const std::string& what, const std::vector<T>& got, const std::vector<double>& ref,
             const std::vector<double>& scale, int size) {
    if (got.size() != ref.size()) return add(what + ": wrong length");
    const double tol = (size + 1) * dtype_traits<T>::epsilon;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double g = static_cast<float>(got[i]);
      if (std::abs(g - ref[i]) <= tol * scale[i]) continue;
      return add(what + ": element " + std::to_string(i) + " is " + std::to_string(g) + ", expected " +
                 std::to_string(ref[i]) + " (tolerance " + std::to_string(tol * scale[i]) + ")");
    }
  }

  template <class T>
  void equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref) {
    if (got.size() != ref.size()) return add(what + ": wrong length");
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!(got[i] == ref[i]))
        return add(what + ": element " + std::to_string(i) + " is " + std::to_string(float(got[i])) + ", expected " +
                   std::to_string(float(ref[i])));
  }

  void add(const std::string& text) { text_ += "rank " + std::to_string(rank_) + ": " + text + "\n"; }
  const std::string& text() const { return text_; }

 private:
  int rank_;
  std::string text_;
};

// The float64 reduction of element i over ranks, for blocks starting at `offset`.
template <class T>
void reduce_reference(const std::vector<std::vector<T>>& all, std::size_t offset, std::size_t n, reduce_op op,
                      std::vector<double>& ref, std::vector<double>& scale) {
  const double div = op == reduce_op::avg ? static_cast<double>(all.size()) : 1.0;
  ref.assign(n, 0.0);
  scale.assign(n, 0.0);
  for (const auto& x : all)
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] += static_cast<float>(x[offset + i]) / div;
      scale[i] += std::abs(static_cast<float>(x[offset + i])) / div;
    }
}

template <class T, class Comm>
void check_collectives(Comm& comm, Failures& fail) {
  const int size = comm.size();
  const int rank = comm.rank();
  const std::string type(dtype_traits<T>::name);
  std::vector<double> ref;
  std::vector<double> scale;
  int tag = 0;
  for (const std::size_t n : lengths) {
    const std::string at = type + " length " + std::to_string(n);
    for (const reduce_op op : {reduce_op::sum, reduce_op::avg}) {
      const std::string name(reduce_op_name(op));
      {
        const auto all = inputs<T>(size, ++tag, n);
        DeviceArray<T> buf(n);
        buf.upload(all[rank]);
        comm.all_reduce(buf.span(), op).synchronize();
        reduce_reference(all, 0, n, op, ref, scale);
        fail.close("all_reduce " + name + " " + at, buf.download(), ref, scale, size);
      }
      {
        const auto all = inputs<T>(size, ++tag, n * size);
        DeviceArray<T> in(n * size);
        DeviceArray<T> out(n);
        in.upload(all[rank]);
        comm.reduce_scatter(in.cspan(), out.span(), op).synchronize();
        reduce_reference(all, n * rank, n, op, ref, scale);
        fail.close("reduce_scatter " + name + " " + at, out.download(), ref, scale, size);
      }
    }
    {
      const auto all = inputs<T>(size, ++tag, n);
      DeviceArray<T> in(n);
      DeviceArray<T> out(n * size);
      in.upload(all[rank]);
      comm.all_gather(in.cspan(), out.span()).synchronize();
      std::vector<T> expect;
      for (const auto& x : all) expect.insert(expect.end(), x.begin(), x.end());
      fail.equal("all_gather " + at, out.download(), expect);
    }
    for (const int root : {0, size - 1}) {
      const auto all = inputs<T>(size, ++tag, n);
      DeviceArray<T> buf(n);
      buf.upload(all[rank]);
      comm.broadcast(buf.span(), root).synchronize();
      fail.equal("broadcast from " + std::to_string(root) + " " + at, buf.download(), all[root]);
    }
  }
  comm.barrier().synchronize();
}

template <class Comm>
std::string check_all_dtypes(Comm& comm) {
  Failures fail(comm.rank());
  check_collectives<float>(comm, fail);
  check_collectives<bf16>(comm, fail);
  check_collectives<fp16>(comm, fail);
  return fail.text();
}

int device_count() {
  int n = 0;
  cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  return n;
}

World world_of_one(CommOptions options = {}) { return World(World::Layout{}, "127.0.0.1", 0, options); }

struct several_gpus {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(device_count() >= 2);
    r.message() << "needs at least 2 GPUs";
    return r;
  }
};

// The callback owns its duration: it may run after the caller has unwound.
void block_stream(cudaStream_t stream, std::chrono::milliseconds how_long) {
  auto* duration = new std::chrono::milliseconds(how_long);
  cuda_check(cudaLaunchHostFunc(
                 stream,
                 [](void* d) {
                   std::unique_ptr<std::chrono::milliseconds> own(static_cast<std::chrono::milliseconds*>(d));
                   std::this_thread::sleep_for(*own);
                 },
                 duration),
             "cudaLaunchHostFunc");
}

}  // namespace

BOOST_AUTO_TEST_CASE(world_of_one_matches_reference_for_every_collective_dtype_and_op) {
  auto world = world_of_one();
  NcclCommunicator comm(world, 0);
  BOOST_TEST(comm.rank() == 0);
  BOOST_TEST(comm.size() == 1);
  const std::string failures = check_all_dtypes(comm);
  BOOST_TEST(failures.empty(), failures);
}

BOOST_AUTO_TEST_CASE(mismatched_sizes_and_bad_roots_are_config_errors) {
  auto world = world_of_one();
  NcclCommunicator comm(world, 0);
  DeviceArray<float> a(5);
  DeviceArray<float> b(4);
  try {
    comm.reduce_scatter(a.cspan(), b.span(), reduce_op::sum);
    BOOST_FAIL("reduce_scatter accepted 5 -> 4 elements");
  } catch (const config_error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("reduce_scatter") != std::string::npos, msg);
    BOOST_TEST(msg.find("5") != std::string::npos, msg);
    BOOST_TEST(msg.find("4") != std::string::npos, msg);
  }
  BOOST_CHECK_THROW(comm.all_gather(a.cspan(), b.span()), config_error);
  BOOST_CHECK_THROW(comm.broadcast(a.span(), 1), config_error);
  BOOST_CHECK_THROW(comm.broadcast(a.span(), -1), config_error);
  BOOST_CHECK_THROW(NcclCommunicator(world, device_count()), config_error);
}

BOOST_AUTO_TEST_CASE(groups_explicit_streams_refs_and_moves) {
  auto world = world_of_one();
  NcclCommunicator owner(world, 0);
  NcclCommunicator comm = std::move(owner);
  BOOST_CHECK_THROW(owner.rank(), config_error);
  NcclRef ref = comm;

  cudaStream_t side = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto x = input<float>(0, 1, 1000);
  const auto y = input<float>(0, 2, 333);
  DeviceArray<float> a(x.size());
  DeviceArray<float> b(y.size());
  a.upload(x);
  b.upload(y);
  NcclWork wa;
  NcclWork wb;
  {
    NcclGroup group;
    wa = comm.all_reduce(a.span(), reduce_op::sum);
    wb = ref.all_reduce(b.span(), reduce_op::avg, side);
    BOOST_CHECK_THROW(wa.wait(), config_error);  // not launched before the group ends
    group.end();
    BOOST_CHECK_THROW(group.end(), config_error);
  }
  wa.synchronize();
  wb.wait(comm.stream());  // orders the communicator's stream after the side stream
  cuda_check(cudaStreamSynchronize(comm.stream()), "cudaStreamSynchronize");
  BOOST_TEST(wb.done());
  BOOST_TEST(wa.sequence() + 1 == wb.sequence());
  Failures fail(0);
  fail.equal("grouped all_reduce sum", a.download(), x);
  fail.equal("grouped all_reduce avg", b.download(), y);
  BOOST_TEST(fail.text().empty(), fail.text());

  comm.set_stream(side);
  BOOST_TEST(ref.stream() == side);
  comm.barrier().synchronize();
  BOOST_TEST(NcclWork{}.done());
  BOOST_TEST(comm.all_reduce(std::span<float>{}, reduce_op::sum).done());
  cuda_check(cudaStreamDestroy(side), "cudaStreamDestroy");
}

BOOST_AUTO_TEST_CASE(a_collective_past_its_timeout_breaks_the_communicator) {
  auto world = world_of_one(CommOptions{.timeout = std::chrono::milliseconds(200)});
  NcclCommunicator comm(world, 0);
  DeviceArray<float> a(16);
  a.upload(input<float>(0, 3, 16));
  // A host function holds the stream, so the collective behind it cannot
  // finish before the watchdog's deadline.
  block_stream(comm.stream(), std::chrono::milliseconds(1500));
  NcclWork work = comm.all_reduce(a.span(), reduce_op::sum);
  try {
    work.synchronize();
    BOOST_FAIL("a collective stuck for 1.5 s did not time out after 200 ms");
  } catch (const timeout_error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("all_reduce") != std::string::npos, msg);
    BOOST_TEST(msg.find("#1") != std::string::npos, msg);
  }
  BOOST_CHECK_THROW(work.wait(), timeout_error);
  BOOST_CHECK_THROW(comm.barrier(), timeout_error);
  BOOST_CHECK_THROW(comm.all_reduce(a.span(), reduce_op::sum), timeout_error);
  cuda_check(cudaStreamSynchronize(comm.stream()), "cudaStreamSynchronize");
}

BOOST_AUTO_TEST_CASE(one_thread_per_gpu_matches_reference, *boost::unit_test::precondition(several_gpus{})) {
  const int n = std::min(device_count(), 4);
  auto worlds = make_local_worlds(n);
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&worlds, r] {
      try {
        NcclCommunicator comm(worlds[r], r);
        return check_all_dtypes(comm);
      } catch (const std::exception& e) {
        return "rank " + std::to_string(r) + " threw: " + e.what() + "\n";
      }
    }));
  for (auto& f : ranks) {
    const std::string failures = f.get();
    BOOST_TEST(failures.empty(), failures);
  }
}

BOOST_AUTO_TEST_CASE(a_timeout_names_the_rank_that_never_arrived, *boost::unit_test::precondition(several_gpus{})) {
  auto worlds = make_local_worlds(2, CommOptions{.timeout = std::chrono::milliseconds(500)});
  std::promise<void> rank0_done;
  auto absent = std::async(std::launch::async, [&] {
    NcclCommunicator comm(worlds[1], 1);
    rank0_done.get_future().wait();  // never issues the collective
  });
  std::string message;
  try {
    NcclCommunicator comm(worlds[0], 0);
    DeviceArray<float> a(1024);
    a.upload(input<float>(0, 4, 1024));
    comm.all_reduce(a.span(), reduce_op::sum).synchronize();
  } catch (const std::exception& e) {
    message = e.what();  // anything but the timeout fails the checks below
  }
  rank0_done.set_value();
  absent.get();
  BOOST_TEST(message.find("all_reduce") != std::string::npos, message);
  BOOST_TEST(message.find("never reached it: 1") != std::string::npos, message);
}
