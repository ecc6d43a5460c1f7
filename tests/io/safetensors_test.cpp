#define BOOST_TEST_MODULE io
#include "dtrain/io/safetensors.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "data/fixture_values.hpp"
#include <boost/test/unit_test.hpp>

using dtrain::element_type;
using dtrain::SafetensorsFile;
using dtrain::SafetensorsWriter;
using namespace dtrain_test;

namespace {

// A file assembled by hand from the spec: u64 header length, header, data.
std::vector<char> spec_file(std::string header, const std::vector<char>& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<char> out;
  append_le(out, static_cast<std::uint64_t>(header.size()));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Opening must fail with checkpoint_error naming the file and `problem`.
void expect_corrupt(const std::filesystem::path& p, const std::string& problem) {
  BOOST_TEST_CONTEXT(problem) {
    BOOST_CHECK_EXCEPTION(SafetensorsFile::open(p), dtrain::checkpoint_error, [&](const dtrain::checkpoint_error& e) {
      const std::string what = e.what();
      return what.find(p.string()) != std::string::npos && what.find(problem) != std::string::npos;
    });
  }
}

std::vector<std::uint8_t> to_u8(std::span<const std::byte> b) {
  std::vector<std::uint8_t> out;
  for (const std::byte x : b) out.push_back(std::to_integer<std::uint8_t>(x));
  return out;
}

template <class R>
concept writer_accepts = requires(SafetensorsWriter& w, R&& r) {
  w.add(std::string("t"), std::vector<std::int64_t>{1}, std::forward<R>(r));
};
// The writer keeps views, so temporaries are a compile error.
static_assert(writer_accepts<std::vector<float>&>);
static_assert(writer_accepts<std::span<const float>>);
static_assert(!writer_accepts<std::vector<float>>);
static_assert(!writer_accepts<std::vector<char>&>);  // char has no safetensors dtype

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors)

BOOST_AUTO_TEST_CASE(round_trip_keeps_every_tensor_aligned) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> w(12);
  for (auto& v : w) v = u(gen);
  std::vector<std::uint8_t> flags{1, 0, 1};
  std::vector<dtrain::bf16> h{dtrain::bf16(1.5f), dtrain::bf16(-2.25f), dtrain::bf16(u(gen)), dtrain::bf16(4.f),
                              dtrain::bf16(u(gen))};
  std::vector<std::int64_t> step{1234567890123};
  std::vector<double> scale{0.1};
  std::vector<float> empty;

  TempDir dir;
  const auto path = dir / "model.safetensors";
  SafetensorsWriter writer;
  writer.add("flags", {3}, flags);  // odd sizes first, to exercise the alignment sort
  writer.add("h", {5}, h);
  writer.add("w", {3, 4}, w);
  writer.add("step", {}, step);
  writer.add("scale", {1}, scale);
  writer.add("empty", {0, 3}, empty);
  writer.set_metadata("format", "pt");
  writer.set_metadata("step", "1000");
  writer.write(path);
  BOOST_TEST(!std::filesystem::exists(dir / "model.safetensors.tmp"));

  const auto raw = read_bytes(path);
  std::uint64_t header_len;
  std::memcpy(&header_len, raw.data(), 8);
  BOOST_TEST(header_len % 8 == 0u);

  const auto f = SafetensorsFile::open(path);
  BOOST_TEST(f.names() == (std::vector<std::string>{"step", "scale", "w", "empty", "h", "flags"}),
             boost::test_tools::per_element());
  BOOST_TEST(f.metadata().at("format") == "pt");
  BOOST_TEST(f.metadata().at("step") == "1000");
  const auto data_start = reinterpret_cast<std::uintptr_t>(f.tensor("step").bytes.data());
  for (const auto& name : f.names()) {
    const auto t = f.tensor(name);
    BOOST_TEST((reinterpret_cast<std::uintptr_t>(t.bytes.data()) - data_start) % dtrain::element_bytes(t.dtype) == 0u,
               name);
  }

  const auto tw = f.tensor("w");
  BOOST_TEST((tw.dtype == element_type::f32));
  BOOST_TEST(tw.shape == (std::vector<std::int64_t>{3, 4}), boost::test_tools::per_element());
  BOOST_TEST(tw.numel() == 12);
  BOOST_TEST(f.read_f32("w") == w, boost::test_tools::per_element());
  BOOST_TEST((f.tensor("h").dtype == element_type::bf16));
  BOOST_TEST(to_u8(f.tensor("h").bytes) == to_u8(std::as_bytes(std::span(h))), boost::test_tools::per_element());
  BOOST_TEST(f.read_i64("step") == step, boost::test_tools::per_element());
  BOOST_TEST(f.tensor("step").shape.empty());
  BOOST_TEST(f.read_i64("flags") == (std::vector<std::int64_t>{1, 0, 1}), boost::test_tools::per_element());
  BOOST_TEST(f.read_f32("scale")[0] == 0.1f);
  BOOST_TEST(f.tensor("empty").bytes.empty());
  BOOST_TEST(f.tensor("empty").shape == (std::vector<std::int64_t>{0, 3}), boost::test_tools::per_element());
  BOOST_CHECK_EXCEPTION(f.tensor("nope"), dtrain::checkpoint_error, [](const auto& e) {
    return std::string(e.what()).find("no tensor 'nope' (it has: step, scale, w, empty, h, flags)") !=
           std::string::npos;
  });
  BOOST_CHECK_THROW(f.read_f32("step"), dtrain::checkpoint_error);
  BOOST_CHECK_THROW(f.read_i64("w"), dtrain::checkpoint_error);
}

// The writer's bytes, pinned against the spec: length, compact JSON padded
// with spaces to a multiple of 8, data.
BOOST_AUTO_TEST_CASE(writer_output_matches_the_spec_byte_for_byte) {
  const std::vector<float> t{1.0f, -2.0f};
  TempDir dir;
  SafetensorsWriter w;
  w.add("t", {2}, t);
  w.write(dir / "t.safetensors");
  std::vector<char> data(8);
  std::memcpy(data.data(), t.data(), 8);
  BOOST_TEST(
      read_bytes(dir / "t.safetensors") == spec_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data),
      boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(reads_a_file_built_from_the_spec) {
  std::vector<char> data;
  append_le(data, std::uint16_t{0x3c00});  // fp16 1.0
  append_le(data, std::uint16_t{0xc000});  // fp16 -2.0
  append_le(data, std::int32_t{-7});
  append_le(data, 0.25);
  TempDir dir;
  // Not in offset order, with spaces and a metadata map, as other writers may produce.
  write_bytes(dir / "spec.safetensors", spec_file(R"({"b": {"dtype": "I32", "shape": [1, 1], "data_offsets": [4, 8]},
                            "__metadata__": {"source": "hand"},
                            "c": {"dtype": "F64", "shape": [], "data_offsets": [8, 16]},
                            "a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})",
                                                  data));
  const auto f = SafetensorsFile::open(dir / "spec.safetensors");
  BOOST_TEST(f.names() == (std::vector<std::string>{"a", "b", "c"}), boost::test_tools::per_element());
  BOOST_TEST(f.read_f32("a") == (std::vector<float>{1.0f, -2.0f}), boost::test_tools::per_element());
  BOOST_TEST(f.read_i64("b") == (std::vector<std::int64_t>{-7}), boost::test_tools::per_element());
  BOOST_TEST(f.read_f32("c") == (std::vector<float>{0.25f}), boost::test_tools::per_element());
  BOOST_TEST(f.metadata().at("source") == "hand");

  const auto py = SafetensorsFile::open(fixture("python_written.safetensors"));
  BOOST_TEST(py.metadata().at("writer") == "make_fixtures.py");
  BOOST_TEST(py.read_f32("x") == fixture_x(), boost::test_tools::per_element());
}

// Against a float64 reference: F64 and F32 are exact to float, F16 within
// 2^-11 and BF16 within 2^-8 relative (half an ulp of their 10/7-bit mantissas).
BOOST_AUTO_TEST_CASE(read_f32_converts_every_float_dtype) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> u(0.5, 100.0);
  std::vector<double> ref(257);
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = (i % 2 ? -1.0 : 1.0) * u(gen);
  std::vector<float> f32(ref.begin(), ref.end());
  std::vector<dtrain::fp16> f16;
  std::vector<dtrain::bf16> b16;
  for (const double v : ref) {
    f16.emplace_back(static_cast<float>(v));
    b16.emplace_back(static_cast<float>(v));
  }
  TempDir dir;
  SafetensorsWriter w;
  const std::vector<std::int64_t> shape{static_cast<std::int64_t>(ref.size())};
  w.add("f64", shape, ref);
  w.add("f32", shape, f32);
  w.add("f16", shape, f16);
  w.add("bf16", shape, b16);
  w.write(dir / "f.safetensors");
  const auto f = SafetensorsFile::open(dir / "f.safetensors");
  const auto check = [&](const std::string& name, double tol) {
    const auto got = f.read_f32(name);
    BOOST_TEST_REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i)
      BOOST_TEST(std::abs(got[i] - ref[i]) <= tol * std::abs(ref[i]), name << "[" << i << "]");
  };
  check("f64", 0x1p-24);
  check("f32", 0x1p-24);
  check("f16", 0x1p-11);
  check("bf16", 0x1p-8);
  BOOST_TEST(f.read_f32("f64") == f32, boost::test_tools::per_element());
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST(f.read_f32("bf16")[i] == static_cast<float>(b16[i]));
}

BOOST_AUTO_TEST_CASE(detects_corruption) {
  TempDir dir;
  const auto put = [&](const std::string& name, const std::vector<char>& bytes) {
    write_bytes(dir / name, bytes);
    return dir / name;
  };
  const std::vector<char> eight(8, '\1');
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  SafetensorsFile::open(put("ok.safetensors", spec_file(ok, eight)));  // the baseline opens

  auto truncated = spec_file(ok, eight);
  truncated.pop_back();
  expect_corrupt(put("truncated.safetensors", truncated), "outside the 7-byte data section");
  expect_corrupt(put("tiny.safetensors", {'\4', '\0', '\0'}), "fewer than the 8-byte header length");
  auto bad_len = spec_file(ok, eight);
  bad_len[0] = '\xff';
  bad_len[3] = '\x01';
  expect_corrupt(put("bad_len.safetensors", bad_len), "header length 16777471 exceeds");
  expect_corrupt(put("not_json.safetensors", spec_file("{\"a\": [1, 2", eight)), "not valid JSON");
  expect_corrupt(put("array.safetensors", spec_file("[1, 2]", {})), "not a JSON object");
  expect_corrupt(put("overlap.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                   "b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                                      eight)),
                 "tensor 'b' overlaps tensor 'a'");
  expect_corrupt(put("gap.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight)),
                 "gap of 4 bytes before tensor 'a'");
  expect_corrupt(put("tail.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight)),
                 "4 bytes after the last tensor");
  expect_corrupt(
      put("dtype.safetensors", spec_file(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", eight)),
      "unknown dtype \"F31\"");
  expect_corrupt(
      put("shape.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight)),
      "spans 8 bytes, expected 12");
  expect_corrupt(
      put("negative.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight)),
      "invalid dimension -2");
  expect_corrupt(
      put("offsets.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", eight)),
      "expected [begin, end]");
  expect_corrupt(
      put("reversed.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight)),
      "data_offsets [8, 0]");
  expect_corrupt(put("no_shape.safetensors", spec_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight)),
                 "tensor 'a' has no \"shape\"");
  expect_corrupt(put("meta.safetensors", spec_file(R"({"__metadata__":{"k":1}})", {})),
                 "__metadata__ entry 'k' is not a string");
  BOOST_CHECK_THROW(SafetensorsFile::open(dir / "missing.safetensors"), dtrain::checkpoint_error);
}

BOOST_AUTO_TEST_CASE(failed_write_leaves_the_old_file_intact) {
  TempDir dir;
  const auto path = dir / "ckpt.safetensors";
  const std::vector<float> old_values{1.f, 2.f};
  SafetensorsWriter first;
  first.add("v", {2}, old_values);
  first.write(path);
  const auto before = read_bytes(path);

  // A directory squatting on the temporary name makes the write fail.
  std::filesystem::create_directory(dir / "ckpt.safetensors.tmp");
  const std::vector<float> new_values{3.f, 4.f, 5.f};
  SafetensorsWriter second;
  second.add("v", {3}, new_values);
  BOOST_CHECK_THROW(second.write(path), dtrain::checkpoint_error);
  BOOST_TEST(read_bytes(path) == before, boost::test_tools::per_element());

  std::filesystem::remove(dir / "ckpt.safetensors.tmp");
  second.write(path);
  BOOST_TEST(SafetensorsFile::open(path).read_f32("v") == new_values, boost::test_tools::per_element());
  BOOST_CHECK_THROW(second.write(dir / "no_such_dir" / "x.safetensors"), dtrain::checkpoint_error);
}

BOOST_AUTO_TEST_CASE(writer_rejects_inconsistent_tensors) {
  const std::vector<float> v{1.f, 2.f, 3.f};
  SafetensorsWriter w;
  w.add("v", {3}, v);
  BOOST_CHECK_THROW(w.add("v", {3}, v), dtrain::checkpoint_error);
  BOOST_CHECK_THROW(w.add("u", {2, 2}, v), dtrain::checkpoint_error);
  BOOST_CHECK_THROW(w.add("n", {-3}, v), dtrain::checkpoint_error);
  BOOST_CHECK_THROW(w.add("__metadata__", {3}, v), dtrain::checkpoint_error);
  BOOST_CHECK_THROW(w.add("", {3}, v), dtrain::checkpoint_error);
  BOOST_TEST(w.size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
