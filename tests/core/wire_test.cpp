// core/wire.hpp: the one serializer of what ranks exchange. Every kind of
// value round-trips (trivially copyable values, strings, vectors, structs
// with named fields, nested); a short or long message is an error;
// first_difference names the field and the element.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/core/error.hpp>
#include <dtrain/core/wire.hpp>

namespace {

struct Inner {
  std::string name;
  std::vector<std::int64_t> dims;
  static constexpr auto wire_fields() {
    return std::tuple{dtrain::field("name", &Inner::name), dtrain::field("dims", &Inner::dims)};
  }
};

struct Outer {
  std::uint64_t count = 0;
  double value = 0;
  std::vector<Inner> parts;
  bool flag = false;
  static constexpr auto wire_fields() {
    return std::tuple{dtrain::field("count", &Outer::count), dtrain::field("value", &Outer::value),
                      dtrain::field("parts", &Outer::parts), dtrain::field("flag", &Outer::flag)};
  }
};

struct Plain {  // trivially copyable, no fields: its bytes
  std::int32_t a;
  float b;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(wire)

BOOST_AUTO_TEST_CASE(values_round_trip) {
  namespace w = dtrain::wire;
  const Outer o{7, -2.5, {{"x", {3, 4}}, {"", {}}, {std::string("a\0b", 3), {-1}}}, true};
  const Outer back = w::decode<Outer>(w::encode(o));
  BOOST_TEST(back.count == 7u);
  BOOST_TEST(back.value == -2.5);
  BOOST_TEST(back.flag);
  BOOST_TEST_REQUIRE(back.parts.size() == 3u);
  BOOST_TEST(back.parts[2].name == std::string("a\0b", 3));
  BOOST_TEST((back.parts[0].dims == std::vector<std::int64_t>{3, 4}));
  BOOST_TEST(!w::first_difference(o, back));
  const Plain p = w::decode<Plain>(w::encode(Plain{-3, 0.25f}));
  BOOST_TEST((p.a == -3 && p.b == 0.25f));
  BOOST_TEST((w::decode<std::vector<std::string>>(w::encode(std::vector<std::string>{"a", "bc"})) ==
              std::vector<std::string>{"a", "bc"}));
}

BOOST_AUTO_TEST_CASE(damaged_messages_are_errors) {
  namespace w = dtrain::wire;
  const std::string bytes = w::encode(Outer{1, 2, {{"name", {1, 2, 3}}}, false});
  BOOST_CHECK_THROW(w::decode<Outer>(bytes.substr(0, bytes.size() - 3)), dtrain::comm_error);
  BOOST_CHECK_THROW(w::decode<Outer>(bytes + "x"), dtrain::comm_error);
  BOOST_CHECK_THROW(w::decode<std::string>(std::string(8, '\xff')), dtrain::comm_error);  // a length past the end
}

BOOST_AUTO_TEST_CASE(first_difference_names_the_field_and_element) {
  namespace w = dtrain::wire;
  const Outer a{1, 2, {{"x", {3, 4}}, {"y", {5}}}, false};
  Outer b = a;
  b.parts[1].dims[0] = 6;
  auto d = w::first_difference(a, b);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST(d->where == "parts[1].dims[0]");
  BOOST_TEST(d->a == "5");
  BOOST_TEST(d->b == "6");
  b = a;
  b.parts.pop_back();
  d = w::first_difference(a, b);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST(d->where == "parts size");
  b = a;
  b.parts[0].name = "z";
  BOOST_TEST(w::first_difference(a, b)->b == "'z'");
  BOOST_TEST(w::text(Inner{"n", {1, 2}}) == "{name 'n', dims [1, 2]}");
}

BOOST_AUTO_TEST_SUITE_END()
