#include "dtrain/data/dataset.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fixture_values.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/io/safetensors.hpp"

using namespace dtrain_test;

namespace {

bool mentions(const dtrain::error& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

void check_is_fixture(const dtrain::Dataset& d) {
  BOOST_TEST(d.rows == fixture_rows);
  BOOST_TEST(d.features == fixture_features);
  BOOST_TEST(d.x == fixture_x(), boost::test_tools::per_element());
  BOOST_TEST(d.y == fixture_y(), boost::test_tools::per_element());
  d.validate(fixture_classes);
}

// A .npy file written here for cases numpy would not produce.
void write_npy(const std::filesystem::path& p, const std::string& dict, const std::vector<char>& data) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::vector<char> bytes{'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  append_le(bytes, static_cast<std::uint16_t>(header.size()));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(p, bytes);
}

template <class T>
std::vector<char> le_bytes(const std::vector<T>& v) {
  std::vector<char> out;
  for (const T x : v) append_le(out, x);
  return out;
}

dtrain::Dataset small_dataset() {
  return {.x = {0.5f, -1.f, 2.f, 3.f, 4.f, -5.f}, .y = {0, 2, 1}, .rows = 3, .features = 2};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dataset)

BOOST_AUTO_TEST_CASE(validate_names_the_first_bad_row) {
  small_dataset().validate(3);

  auto bad_label = small_dataset();
  bad_label.y[1] = 3;
  BOOST_CHECK_EXCEPTION(bad_label.validate(3), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "row 1 has label 3"); });
  bad_label.y[1] = -1;
  BOOST_CHECK_EXCEPTION(bad_label.validate(3), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "row 1 has label -1"); });

  auto nan_feature = small_dataset();
  nan_feature.x[5] = std::numeric_limits<float>::quiet_NaN();
  BOOST_CHECK_EXCEPTION(nan_feature.validate(3), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "row 2, feature 1"); });

  auto short_y = small_dataset();
  short_y.y.pop_back();
  BOOST_CHECK_THROW(short_y.validate(3), dtrain::config_error);
  auto short_x = small_dataset();
  short_x.x.pop_back();
  BOOST_CHECK_THROW(short_x.validate(3), dtrain::config_error);
  BOOST_CHECK_THROW(small_dataset().validate(0), dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::Dataset{}.validate(3), dtrain::config_error);
}

BOOST_AUTO_TEST_CASE(reads_numpy_files_of_every_header_version) {
  check_is_fixture(dtrain::load_npy_dataset(fixture("x_f32_v1.npy"), fixture("y_i64_v1.npy")));
  check_is_fixture(dtrain::load_npy_dataset(fixture("x_f64_v2.npy"), fixture("y_i32_v2.npy")));
  check_is_fixture(dtrain::load_npy_dataset(fixture("x_f32_v3.npy"), fixture("y_i32_v2.npy")));
}

BOOST_AUTO_TEST_CASE(rejects_npy_files_it_cannot_read_correctly) {
  const auto y = fixture("y_i64_v1.npy");
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(fixture("x_big_endian.npy"), y), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "big-endian") && mentions(e, "x_big_endian.npy"); });
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(fixture("x_fortran.npy"), y), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "Fortran"); });
  // Swapped arguments: integer features, float labels.
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(y, fixture("x_f32_v1.npy")), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "integer dtype"); });

  TempDir dir;
  auto truncated = read_bytes(fixture("x_f32_v1.npy"));
  truncated.erase(truncated.end() - 4, truncated.end());
  write_bytes(dir / "truncated.npy", truncated);
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(dir / "truncated.npy", y), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "needs 84 data bytes but the file has 80"); });

  write_bytes(dir / "garbage.npy", {'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0, 0, 0});
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(dir / "garbage.npy", y), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "not a .npy file"); });
  BOOST_CHECK_THROW(dtrain::load_npy_dataset(dir / "missing.npy", y), dtrain::config_error);

  write_npy(dir / "bool.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (7,), }", std::vector<char>(7));
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(fixture("x_f32_v1.npy"), dir / "bool.npy"), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "unsupported .npy dtype '|b1'"); });
  write_npy(dir / "odd_key.npy", "{'descr': '<i4', 'order': False, 'shape': (7,), }", std::vector<char>(28));
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(fixture("x_f32_v1.npy"), dir / "odd_key.npy"), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "unexpected key 'order'"); });

  write_npy(dir / "y5.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }",
            le_bytes(std::vector<std::int32_t>{0, 1, 2, 3, 0}));
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(fixture("x_f32_v1.npy"), dir / "y5.npy"), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "x has 7 rows but y has 5 labels"); });

  write_npy(dir / "y_huge.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
            le_bytes(std::vector<std::int64_t>{1, std::int64_t{1} << 40}));
  write_npy(dir / "x2.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }",
            le_bytes(std::vector<float>{1.f, 2.f}));
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(dir / "x2.npy", dir / "y_huge.npy"), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "at row 1 does not fit in int32"); });
  write_npy(dir / "y2d.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1), }",
            le_bytes(std::vector<std::int32_t>{0, 1}));
  BOOST_CHECK_EXCEPTION(dtrain::load_npy_dataset(dir / "x2.npy", dir / "y2d.npy"), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "expected [rows]"); });
}

BOOST_AUTO_TEST_CASE(reads_safetensors_datasets) {
  // Written by an independent Python implementation of the format: F64 x, I32 y.
  check_is_fixture(dtrain::load_safetensors_dataset(fixture("python_written.safetensors")));

  const auto x = fixture_x();
  std::vector<double> x64(x.begin(), x.end());
  std::vector<dtrain::bf16> xb;
  std::vector<dtrain::fp16> xh;
  for (const float v : x) {
    xb.emplace_back(v);
    xh.emplace_back(v);
  }
  const auto y = fixture_y();
  std::vector<std::int64_t> y64(y.begin(), y.end());
  const std::vector<std::int64_t> xs{fixture_rows, fixture_features}, ys{fixture_rows};

  TempDir dir;
  const auto write = [&](const std::string& name, auto& xv, auto& yv) {
    dtrain::SafetensorsWriter w;
    w.add("x", xs, xv);
    w.add("y", ys, yv);
    w.write(dir / name);
    return dir / name;
  };
  check_is_fixture(dtrain::load_safetensors_dataset(write("f32.safetensors", x, y64)));
  check_is_fixture(dtrain::load_safetensors_dataset(write("f64.safetensors", x64, y)));
  check_is_fixture(dtrain::load_safetensors_dataset(write("bf16.safetensors", xb, y)));
  check_is_fixture(dtrain::load_safetensors_dataset(write("f16.safetensors", xh, y64)));

  std::vector<std::int32_t> x_int(x.size(), 1);
  BOOST_CHECK_EXCEPTION(dtrain::load_safetensors_dataset(write("int_x.safetensors", x_int, y)), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "features 'x' have dtype I32"); });
  dtrain::SafetensorsWriter only_x;
  only_x.add("x", xs, x);
  only_x.write(dir / "only_x.safetensors");
  BOOST_CHECK_EXCEPTION(dtrain::load_safetensors_dataset(dir / "only_x.safetensors"), dtrain::config_error,
                        [](const auto& e) { return mentions(e, "lacks tensor 'x' or 'y'"); });
}

BOOST_AUTO_TEST_SUITE_END()
