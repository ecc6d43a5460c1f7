#define BOOST_TEST_MODULE io
#include "dtrain/io/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "data/fixture_values.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/data/preference.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/hf/config.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/io/files.hpp"
#include "dtrain/io/json.hpp"
#include "dtrain/train/grpo.hpp"

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

// Files from elsewhere (a downloaded checkpoint, a model from the Hub): a
// name that leads out of the checkpoint's directory, sizes beyond the file
// or absurd nesting are refused with a dtrain error naming the file and the
// problem, never a crash, a huge allocation or a read of another file.
BOOST_AUTO_TEST_SUITE(untrusted_files)

namespace {

namespace fs = std::filesystem;

// `f()` must throw E with every one of `parts` in its message.
template <class E, class F>
void expect_refused(F&& f, const std::vector<std::string>& parts) {
  std::string all;
  for (const auto& p : parts) all += "[" + p + "]";
  BOOST_TEST_CONTEXT(all) {
    BOOST_CHECK_EXCEPTION(f(), E, [&](const E& e) {
      const std::string what = e.what();
      const bool named = std::ranges::all_of(parts, [&](const auto& p) { return what.find(p) != std::string::npos; });
      if (!named) BOOST_TEST_MESSAGE("message: " + what);
      return named;
    });
  }
}

void write_text(const fs::path& p, const std::string& text) { write_bytes(p, {text.begin(), text.end()}); }

std::string deep_json(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string read_text(const fs::path& p) {
  const auto bytes = read_bytes(p);
  return {bytes.begin(), bytes.end()};
}

// The corpus's index of a 2-rank DDP checkpoint: every piece in one shard.
const std::string shard = "shard-00000-of-00002.safetensors";
std::string seed_index() {
  return read_text(fs::path(DTRAIN_SOURCE_DIR) / "tests/corpus/checkpoint_index/seed_index.json");
}

}  // namespace

BOOST_AUTO_TEST_CASE(contained_path_keeps_names_inside_their_directory) {
  using dtrain::detail::contained_path;
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  fs::create_directories(dir / "sub");
  write_text(tmp / "outside.bin", "secret");
  write_text(dir / "inside.bin", "ok");
  fs::create_symlink("inside.bin", dir / "link_inside");
  fs::create_symlink("../outside.bin", dir / "link_outside");
  fs::create_symlink(fs::absolute(tmp / "outside.bin"), dir / "link_absolute");
  fs::create_symlink(".", dir / "link_dir");
  fs::create_symlink("loop", dir / "loop");

  BOOST_TEST(contained_path(dir, "inside.bin", "'index.json'") == dir / "inside.bin");
  BOOST_TEST(contained_path(dir, "link_inside", "'index.json'") == dir / "link_inside");
  BOOST_TEST(contained_path(dir, "not_there_yet.bin", "'index.json'") == dir / "not_there_yet.bin");
  BOOST_TEST(contained_path(dir, "a..b", "'index.json'") == dir / "a..b");  // dots in a name are no climb

  using dtrain::checkpoint_error;
  const auto refused = [&](const std::string& name, const std::string& problem) {
    expect_refused<checkpoint_error>([&] { (void)contained_path(dir, name, "'index.json'"); },
                                     {"'index.json' names the file", problem});
  };
  refused("../outside.bin", "climbs out of its directory");
  refused("sub/../../outside.bin", "climbs out of its directory");
  refused("..", "climbs out of its directory");
  refused("/etc/passwd", "is an absolute path");
  refused("sub/inside.bin", "has a path separator");
  refused("sub\\inside.bin", "has a path separator");
  refused(std::string("inside.bin\0.txt", 15), "holds a NUL byte");
  refused("", "is empty");
  refused(".", "is the directory");
  refused(std::string(300, 'a'), "longer than the 255 bytes");
  refused("link_outside", "is a symbolic link to");
  refused("link_absolute", "outside its directory");
  refused("link_dir", "is a symbolic link to its directory");
  refused("loop", "cannot be resolved");
}

BOOST_AUTO_TEST_CASE(checkpoint_index_names_only_files_in_its_directory) {
  TempDir tmp;
  const fs::path parent = tmp / "run";
  const fs::path dir = parent / "step-00000002";
  fs::create_directories(dir);
  write_text(parent / "outside.bin", "not a checkpoint file");
  const std::string index = seed_index();
  const fs::path index_path = dir / std::string(dtrain::checkpoint_index_name);

  write_text(index_path, index);  // the valid index reads (its shard need not exist to read the index)
  BOOST_TEST(dtrain::checkpoint_info(dir).step == 2);
  BOOST_TEST(dtrain::list_checkpoints(parent).size() == 1u);

  using dtrain::checkpoint_error;
  const auto refused = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_text(index_path, text);
    expect_refused<checkpoint_error>([&] { (void)dtrain::checkpoint_info(dir); }, parts);
    BOOST_TEST(!dtrain::is_checkpoint(dir));
    BOOST_TEST(dtrain::list_checkpoints(parent).empty());  // resume=latest passes it over
  };
  refused(replace_all(index, shard, "../outside.bin"),
          {index_path.string(), "'../outside.bin'", "climbs out of its directory"});
  const std::string absolute = fs::absolute(parent / "outside.bin").string();
  refused(replace_all(index, shard, absolute), {index_path.string(), "is an absolute path"});
  refused(replace_all(index, "\"count\": 32", "\"count\": 33"),
          {index_path.string(), "claims 33 elements from element 0, beyond the tensor's 32"});
  refused(
      replace_all(index, "\"begin\": 0,\n      \"count\": 8,", "\"begin\": 18446744073709551615,\n      \"count\": 9,"),
      {index_path.string(), "beyond the tensor's 8"});
  refused(replace_all(index, "\"metadata\": {}", "\"metadata\": " + deep_json(100000)),
          {index_path.string(), "nested more than 128 levels deep"});

  // A shard that is a symbolic link out of the directory: refused where the
  // index is read, and where the file would be opened.
  write_text(index_path, index);
  fs::create_symlink("../outside.bin", dir / shard);
  expect_refused<checkpoint_error>([&] { (void)dtrain::checkpoint_info(dir); },
                                   {index_path.string(), "is a symbolic link to", "outside its directory"});
  const std::map<std::string, std::uint64_t> sizes;
  dtrain::detail::PieceReader reader(dir, sizes);
  dtrain::CheckpointPiece piece{shard, "param/0.bias/0", 0, 8, element_type::f32, 0};
  expect_refused<checkpoint_error>([&] { (void)reader.bytes("0.bias", "param", piece); },
                                   {"is a symbolic link to", "outside its directory"});
  piece.file = "../outside.bin";
  expect_refused<checkpoint_error>([&] { (void)reader.bytes("0.bias", "param", piece); },
                                   {"the index of checkpoint", "climbs out of its directory"});
}

BOOST_AUTO_TEST_CASE(transformers_index_names_only_files_in_its_directory) {
  TempDir tmp;
  const fs::path dir = tmp / "model";
  fs::create_directories(dir);
  const std::vector<float> values{1.f, 2.f};
  SafetensorsWriter w;
  w.add("a", {2}, values);
  w.write(tmp / "outside.safetensors");  // a valid file, which no index may reach
  w.write(dir / "model-00001-of-00001.safetensors");
  const fs::path index = dir / "model.safetensors.index.json";
  const auto with_shard = [](const std::string& file) {
    return R"({"metadata": {"total_size": 8}, "weight_map": {"a": ")" + file + "\"}}";
  };

  write_text(index, with_shard("model-00001-of-00001.safetensors"));
  const auto ok = dtrain::hf::open_checkpoint(dir, {});
  BOOST_TEST(ok.files.size() == 1u);
  BOOST_TEST(ok.files[0].read_f32("a") == values, boost::test_tools::per_element());

  using dtrain::checkpoint_error;
  const auto refused = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_text(index, text);
    expect_refused<checkpoint_error>([&] { (void)dtrain::hf::open_checkpoint(dir, {}); }, parts);
  };
  refused(with_shard("../outside.safetensors"), {index.string(), "weight_map[\"a\"]", "climbs out of its directory"});
  refused(with_shard(fs::absolute(tmp / "outside.safetensors").string()), {index.string(), "is an absolute path"});
  refused(with_shard("sub/model.safetensors"), {index.string(), "has a path separator"});
  refused(R"({"weight_map": {"a": "model\u0000.safetensors"}})", {index.string(), "holds a NUL byte"});
  refused(R"({"weight_map": )" + deep_json(100000) + "}", {index.string(), "nested more than 128 levels deep"});
  // A shard that is a symbolic link out of the folder is followed: the
  // Hugging Face cache's snapshot folders hold links to its blobs.
  fs::create_symlink("../outside.safetensors", dir / "model-00002-of-00002.safetensors");
  write_text(index, with_shard("model-00002-of-00002.safetensors"));
  const auto linked = dtrain::hf::open_checkpoint(dir, {});
  BOOST_TEST(linked.files.size() == 1u);
  BOOST_TEST(linked.files[0].read_f32("a") == values, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(safetensors_claims_beyond_the_file_are_refused) {
  TempDir dir;
  const auto put = [&](const std::string& name, const std::vector<char>& bytes) {
    write_bytes(dir / name, bytes);
    return dir / name;
  };
  const std::vector<char> eight(8, '\1');
  SafetensorsFile::open(put("ok.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                                        eight)));  // the baseline opens

  expect_corrupt(
      put("far_offsets.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,
                                                                                    18446744073709551615]}})",
                                               eight)),
      "outside the 8-byte data section");
  expect_corrupt(
      put("long_end.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight)),
      "data_offsets [0, 16] outside the 8-byte data section");
  // 2^32 * 2^32 * 4 bytes wraps to 0 in 64 bits: the product is checked, not wrapped.
  expect_corrupt(put("overflow.safetensors",
                     spec_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,1],"data_offsets":[0,0]},
                                   "b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                               eight)),
                 "an overflowing count");
  expect_corrupt(put("rank.safetensors", spec_file(R"({"a":{"dtype":"F32","shape":[2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],
                                                        "data_offsets":[0,8]}})",
                                                   eight)),
                 "has 17 dimensions, more than the 16");
  auto huge_len = spec_file("{}", {});
  huge_len[0] = '\xff';
  huge_len[7] = '\x7f';
  expect_corrupt(put("huge_len.safetensors", huge_len), "exceeds the");
  expect_corrupt(put("deep.safetensors", spec_file(R"({"__metadata__":)" + deep_json(100000) + "}", {})),
                 "nested more than 128 levels deep");
  // Brackets inside strings are text, not nesting.
  const auto text = SafetensorsFile::open(
      put("brackets.safetensors", spec_file(R"({"__metadata__":{"k":")" + std::string(1000, '[') + R"("}})", {})));
  BOOST_TEST(text.metadata().at("k") == std::string(1000, '['));

  // A header beyond the format's limit is refused before it is read: a
  // sparse file holds the length without the bytes.
  std::vector<char> limit_len;
  append_le(limit_len, static_cast<std::uint64_t>(dtrain::safetensors_max_header_bytes + 8));
  const auto sparse = put("limit.safetensors", limit_len);
  fs::resize_file(sparse, dtrain::safetensors_max_header_bytes + 64);
  expect_corrupt(sparse, "exceeds the format's limit of 100000000 bytes");
}

BOOST_AUTO_TEST_CASE(deeply_nested_json_is_refused_everywhere) {
  TempDir dir;
  const std::string deep = deep_json(100000);
  write_text(dir / "config.json", R"({"model_type": "llama", "rope_scaling": )" + deep + "}");
  expect_refused<dtrain::config_error>([&] { (void)dtrain::hf::read_config(dir / "config.json"); },
                                       {(dir / "config.json").string(), "nested more than 128 levels deep"});
  const fs::path adapter = dir / "adapter";
  fs::create_directories(adapter);
  write_text(adapter / "adapter_config.json", R"({"peft_type": "LORA", "target_modules": )" + deep + "}");
  expect_refused<dtrain::checkpoint_error>([&] { (void)dtrain::hf::read_adapter_config(adapter); },
                                           {(adapter / "adapter_config.json").string(), "nested more than 128"});
  // 128 levels are read; the 129th is refused, at its byte.
  const auto parse = [](const std::string& text) {
    return dtrain::detail::parse_json(text, [](const std::string& p) { return dtrain::config_error(p); });
  };
  BOOST_TEST(parse(deep_json(dtrain::detail::json_max_depth)).is_array());
  expect_refused<dtrain::config_error>([&] { (void)parse(deep_json(dtrain::detail::json_max_depth + 1)); },
                                       {"at byte 128"});
  expect_refused<dtrain::config_error>([&] { (void)parse("{\"a\": [1, 2"); }, {"not valid JSON"});
  // Training data and a GRPO reward's vocabulary: the same limit, with the line.
  write_text(dir / "pairs.jsonl", R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]})"
                                  "\n"
                                  R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": )" +
                                      deep + "}\n");
  expect_refused<dtrain::config_error>([&] { (void)dtrain::read_preference_pairs(dir / "pairs.jsonl", 8, 50); },
                                       {"pairs.jsonl', line 2: JSON nested more than 128"});
  write_text(dir / "vocab.json", R"({"a": 0, "b": )" + deep + "}");
  expect_refused<dtrain::config_error>([&] { (void)dtrain::rewards::read_vocabulary(dir / "vocab.json"); },
                                       {"vocab.json' is JSON nested more than 128"});
}

// A vocabulary's ids count up from 0: one far beyond is refused before the
// id -> text table is made that large.
BOOST_AUTO_TEST_CASE(vocabulary_ids_far_beyond_its_size_are_refused) {
  TempDir dir;
  write_text(dir / "vocab.json", R"({"a": 0, "b": 1, "c": 2})");
  const auto vocab = dtrain::rewards::read_vocabulary(dir / "vocab.json");
  BOOST_TEST(vocab.size() == 3u);
  BOOST_TEST(vocab[2] == "c");
  write_text(dir / "vocab.json", R"({"a": 0, "b": 9000000000000})");
  expect_refused<dtrain::config_error>([&] { (void)dtrain::rewards::read_vocabulary(dir / "vocab.json"); },
                                       {"maps 'b' to 9000000000000", "beyond the 16777216 ids"});
}

BOOST_AUTO_TEST_SUITE_END()
