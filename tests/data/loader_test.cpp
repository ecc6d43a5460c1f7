#include "dtrain/data/loader.hpp"

#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include <boost/test/unit_test.hpp>

using dtrain::Batch;
using dtrain::DataLoader;
using dtrain::DistributedSampler;
using Indices = std::vector<std::int64_t>;

namespace {

constexpr std::int64_t rows = 37;
constexpr std::int64_t features = 3;
constexpr std::int64_t batch = 5;
const dtrain::SamplerOptions sampler_options{.seed = 11};

dtrain::Dataset make_dataset() {
  dtrain::Dataset d;
  d.rows = rows;
  d.features = features;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < features; ++j) d.x.push_back(static_cast<float>(r * 10 + j) + 0.5f);
    d.y.push_back(static_cast<std::int32_t>(r % 5));
  }
  return d;
}

// The batches any loader must produce: consecutive runs of the sampler's
// index stream (19 samples per rank-1 epoch, so batches straddle epochs).
std::vector<Indices> reference_batches(int count) {
  DistributedSampler s(rows, 1, 2, sampler_options);
  std::vector<Indices> out;
  for (int i = 0; i < count; ++i) out.push_back(s.next(batch));
  return out;
}

void check_batch(const Batch& b, const Indices& expected, const dtrain::Dataset& d) {
  BOOST_TEST_REQUIRE(b.rows() == batch);
  BOOST_TEST((b.at("x").shape == std::vector<std::int64_t>{batch, features}));
  BOOST_TEST(b.indices == expected, boost::test_tools::per_element());
  const auto x = b.at("x").values<float>();
  const auto y = b.at("y").values<std::int32_t>();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto row = static_cast<std::size_t>(expected[i]);
    BOOST_TEST(y[i] == d.y[row]);
    for (std::size_t j = 0; j < features; ++j) BOOST_TEST(x[i * features + j] == d.x[row * features + j]);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loader)

BOOST_AUTO_TEST_CASE(order_is_independent_of_workers_and_prefetch) {
  const auto data = make_dataset();
  const auto expected = reference_batches(20);
  for (const int workers : {0, 1, 3})
    for (const int prefetch : {1, 4}) {
      BOOST_TEST_CONTEXT("workers=" << workers << " prefetch=" << prefetch) {
        DistributedSampler sampler(rows, 1, 2, sampler_options);
        // Uneven gather times make workers finish out of order.
        DataLoader loader(
            data, sampler,
            {.batch_size = batch, .num_workers = workers, .prefetch = prefetch, .transform = [](Batch& b) {
               std::this_thread::sleep_for(std::chrono::microseconds(300 * (b.indices[0] % 4)));
             }});
        for (const auto& e : expected) check_batch(loader.next(), e, data);
        // The caller's sampler reflects consumed batches, not read-ahead.
        BOOST_TEST((sampler.state() == dtrain::SamplerState{5, 5}));  // 100 samples = 5 epochs of 19 + 5
      }
    }
}

BOOST_AUTO_TEST_CASE(resumes_from_the_sampler_state) {
  const auto data = make_dataset();
  const auto expected = reference_batches(8);
  dtrain::SamplerState saved;
  {
    DistributedSampler sampler(rows, 1, 2, sampler_options);
    DataLoader loader(data, sampler, {.batch_size = batch, .num_workers = 2, .prefetch = 4});
    for (int i = 0; i < 4; ++i) loader.next();
    saved = sampler.state();
  }
  DistributedSampler sampler(rows, 1, 2, sampler_options);
  sampler.load_state(saved);
  DataLoader loader(data, sampler, {.batch_size = batch, .num_workers = 3});
  for (std::size_t i = 4; i < expected.size(); ++i) check_batch(loader.next(), expected[i], data);
}

namespace {

// A source whose rows are (index, epoch): what an EpochSource is given.
struct EpochRows {
  std::int64_t size() const { return rows; }
  Batch gather(std::span<const std::int64_t> indices) const { return gather(indices, Indices(indices.size(), -1)); }
  Batch gather(std::span<const std::int64_t> indices, std::span<const std::int64_t> epochs) const {
    std::vector<std::int64_t> v;
    for (std::size_t i = 0; i < indices.size(); ++i) {
      v.push_back(indices[i]);
      v.push_back(epochs[i]);
    }
    Batch b;
    b.set("x", dtrain::HostTensor::of(v, {static_cast<std::int64_t>(indices.size()), 2}));
    return b;
  }
};
static_assert(dtrain::EpochSource<EpochRows>);
static_assert(!dtrain::EpochSource<dtrain::Dataset>);

}  // namespace

// Each index comes with the epoch the sampler drew it in (19 samples per
// rank-1 epoch: batches straddle epochs), with any workers and after a resume.
BOOST_AUTO_TEST_CASE(an_epoch_source_gets_each_index_epoch) {
  DistributedSampler reference(rows, 1, 2, sampler_options);
  std::vector<std::int64_t> want;  // index, epoch pairs
  for (int k = 0; k < 12 * batch; ++k) {
    const std::int64_t epoch =
        reference.state().position == reference.num_samples() ? reference.epoch() + 1 : reference.epoch();
    want.push_back(reference.next(1).at(0));
    want.push_back(epoch);
  }
  const EpochRows source;
  for (const int workers : {0, 3}) {
    DistributedSampler sampler(rows, 1, 2, sampler_options);
    std::vector<std::int64_t> got;
    {
      DataLoader loader(source, sampler, {.batch_size = batch, .num_workers = workers});
      for (int k = 0; k < 5; ++k) {
        const Batch b = loader.next();
        for (const auto v : b.at("x").values<std::int64_t>()) got.push_back(v);
      }
    }
    const dtrain::SamplerState saved = sampler.state();
    DistributedSampler resumed(rows, 1, 2, sampler_options);
    resumed.load_state(saved);
    DataLoader loader(source, resumed, {.batch_size = batch, .num_workers = workers});
    for (int k = 5; k < 12; ++k) {
      const Batch b = loader.next();
      for (const auto v : b.at("x").values<std::int64_t>()) got.push_back(v);
    }
    BOOST_TEST(got == want, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(transform_runs_on_every_batch) {
  const auto data = make_dataset();
  DistributedSampler sampler(rows, 0, 1, sampler_options);
  DataLoader loader(data, sampler, {.batch_size = batch, .num_workers = 2, .transform = [](Batch& b) {
                                      for (auto& v : b.at("x").values<float>()) v *= 2.0f;
                                    }});
  for (int i = 0; i < 10; ++i) {
    const auto b = loader.next();
    const auto x = b.at("x").values<float>();
    for (std::size_t k = 0; k < x.size(); ++k)
      BOOST_TEST(x[k] == 2.0f * data.x[static_cast<std::size_t>(b.indices[k / features]) * features + k % features]);
  }
}

BOOST_AUTO_TEST_CASE(worker_exceptions_reach_next_in_order) {
  const auto data = make_dataset();
  const auto expected = reference_batches(3);
  for (const int workers : {0, 1, 3}) {
    BOOST_TEST_CONTEXT("workers=" << workers) {
      DistributedSampler sampler(rows, 1, 2, sampler_options);
      const auto poisoned = expected[2];
      DataLoader loader(data, sampler, {.batch_size = batch, .num_workers = workers, .transform = [&](Batch& b) {
                                          if (b.indices == poisoned) throw std::runtime_error("bad batch");
                                        }});
      check_batch(loader.next(), expected[0], data);
      check_batch(loader.next(), expected[1], data);
      BOOST_CHECK_THROW(loader.next(), std::runtime_error);
      BOOST_CHECK_THROW(loader.next(), std::runtime_error);  // stays failed
      BOOST_TEST((sampler.state() == dtrain::SamplerState{0, 10}));
    }
  }
}

// Destroying a loader whose workers are blocked on a full queue, or busy in
// a slow transform, must return promptly.
BOOST_AUTO_TEST_CASE(early_destruction_does_not_hang) {
  const auto data = make_dataset();
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 20; ++round) {
    DistributedSampler sampler(rows, 0, 1, sampler_options);
    DataLoader loader(data, sampler, {.batch_size = batch, .num_workers = 3, .prefetch = 2, .transform = [](Batch&) {
                                        std::this_thread::sleep_for(std::chrono::milliseconds(1));
                                      }});
    if (round % 2) loader.next();
  }
  {
    DistributedSampler sampler(rows, 0, 1, sampler_options);
    DataLoader never_used(data, sampler, {.batch_size = batch, .num_workers = 2});
  }
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(10)));
}

BOOST_AUTO_TEST_CASE(rejects_bad_options) {
  const auto data = make_dataset();
  DistributedSampler sampler(rows, 0, 1);
  BOOST_CHECK_THROW(DataLoader(data, sampler, {.batch_size = 0}), dtrain::config_error);
  BOOST_CHECK_THROW(DataLoader(data, sampler, {.batch_size = 2, .num_workers = -1}), dtrain::config_error);
  BOOST_CHECK_THROW(DataLoader(data, sampler, {.batch_size = 2, .prefetch = 0}), dtrain::config_error);
  DistributedSampler too_big(rows + 1, 0, 1);
  BOOST_CHECK_THROW(DataLoader(data, too_big, {.batch_size = 2}), dtrain::config_error);
}

BOOST_AUTO_TEST_SUITE_END()
