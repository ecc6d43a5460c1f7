// The attention family (nn/attention_policies.hpp) on the host: its policies
// resolve as documented, and the forms beyond today's causal units
// (bidirectional, padded, packed, cross-attention, grouped-query heads,
// QK-norm) match float64 references (nn/attention_reference.hpp) forward and
// in every gradient, on random non-zero inputs, in every dtype.
// Tolerances: check_unit's (fp32 1e-5 forward and 1e-4 backward, relative
// to the largest reference element), widened for bf16 and fp16 as
// family_scale says.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "nn/attention_reference.hpp"
#include "nn/reference.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/attention_policies.hpp"
#include "dtrain/nn/rotary_attention.hpp"

namespace t = dtrain::testing;
namespace nn = dtrain::nn;
using dtrain::SeqShape;

// Policies in any order, defaults for the rest; today's units are members.
static_assert(std::is_same_v<nn::CausalSelfAttention, nn::Attention<nn::FusedQkv>>);
static_assert(std::is_same_v<nn::RotaryAttention, nn::Attention<nn::Rotary, nn::Causal, nn::SeparateQkv>>);
static_assert(std::is_same_v<nn::Attention<nn::CrossInput, nn::Bidirectional>,
                             nn::Attention<nn::Bidirectional, nn::NoPositions, nn::CrossInput>>);
static_assert(
    std::is_same_v<nn::Attention<>, nn::AttentionUnit<nn::Causal, nn::NoPositions, nn::SeparateQkv, nn::SelfInput>>);

namespace {

template <class T>
void check_group(t::FamilyGroup group) {
  dtrain::Host dev(1);
  t::family_cases(group, [&](const std::string& name, auto unit, const t::FamilySpec& f, const t::FamilyInputs& in) {
    BOOST_TEST_CONTEXT(name) { t::check_family_on<T>(dev, std::move(unit), f, in, t::family_scale<T>(f)); }
  });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention_family)

BOOST_AUTO_TEST_CASE_TEMPLATE(bidirectional, T, t::dtypes) { check_group<T>(t::FamilyGroup::bidirectional); }

BOOST_AUTO_TEST_CASE_TEMPLATE(qk_norm, T, t::dtypes) { check_group<T>(t::FamilyGroup::qk_norm); }

BOOST_AUTO_TEST_CASE_TEMPLATE(packed_bidirectional, T, t::dtypes) { check_group<T>(t::FamilyGroup::packed); }

BOOST_AUTO_TEST_CASE_TEMPLATE(cross, T, t::dtypes) { check_group<T>(t::FamilyGroup::cross); }

BOOST_AUTO_TEST_CASE_TEMPLATE(sliding_window, T, t::dtypes) { check_group<T>(t::FamilyGroup::sliding_window); }

// A window at least as long as the sequence leaves every causal key: the
// same outputs, bit for bit, as no window.
BOOST_AUTO_TEST_CASE(a_long_window_is_no_window) {
  dtrain::Host dev(1);
  const t::FamilySpec f{.kv_heads = 2, .causal = true, .theta = 500.0};
  t::FamilySpec windowed = f;
  windowed.window = 7;
  t::FamilyInputs in{.shape = {2, 7}, .k_time = 7};
  nn::RotaryAttention plain(16, 4, t::family_options(f)), wide(16, 4, t::family_options(windowed));
  const t::UnitCase c = t::family_case<float>(plain, f, in);
  const t::FamilyResult a = t::run_family<float>(dev, plain, f, in, c), b = t::run_family<float>(dev, wide, f, in, c);
  BOOST_TEST(a.unit.y == b.unit.y);
  BOOST_TEST(a.unit.dx == b.unit.dx);
}

// The RotaryAttention alias against the family's reference: today's form.
BOOST_AUTO_TEST_CASE(rotary_alias_matches_the_family_reference) {
  dtrain::Host dev(1);
  const t::FamilySpec f{.kv_heads = 2, .causal = true, .out_bias = true, .theta = 10000.0};
  t::check_family_on<float>(dev, nn::RotaryAttention(16, 4, t::family_options(f)), f, {.shape = {2, 7}, .k_time = 7},
                            1.0);
}

BOOST_AUTO_TEST_CASE(parameters_and_errors) {
  const auto cross = nn::Attention<nn::CrossInput, nn::Bidirectional>(16, 4, {.kv_heads = 2, .memory_dim = 12});
  BOOST_TEST(cross.params()[1].shape == (std::vector<std::int64_t>{8, 12}));
  const auto qk = nn::Attention<nn::Rotary>(16, 4, {.qk_norm = true});
  BOOST_TEST(qk.params().size() == 6u);
  BOOST_TEST(qk.params()[4].name == "q_norm.weight");
  BOOST_TEST(qk.params()[5].shape == std::vector<std::int64_t>{4});
  // LoRA on a cross-attention: k's and v's adapters read the memory (checked against float64 in
  // tests/diffusion/spatial_transformer_test.cpp's lora_on_every_projection)
  const auto adapted = nn::Attention<nn::CrossInput, nn::Bidirectional>(16, 4, {.k_lora = {.r = 2}, .memory_dim = 12});
  BOOST_TEST(adapted.params().back().name == "k.lora_B");
  BOOST_TEST(adapted.params()[adapted.params().size() - 2].shape == (std::vector<std::int64_t>{2, 12}));
  BOOST_CHECK_THROW((nn::Attention<nn::Bidirectional>(16, 4, {.window = 3})), dtrain::config_error);
  BOOST_CHECK_THROW((nn::Attention<nn::Rotary>(16, 4, {.window = -1})), dtrain::config_error);
  BOOST_CHECK_THROW((nn::Attention<nn::Rotary>(16, 4, {.rope_factor = 0.f})), dtrain::config_error);
  const auto gemma = nn::Attention<nn::Rotary>(16, 4, {.qk_norm = true, .qk_norm_offset = 1.f});
  BOOST_TEST((gemma.params()[4].init.kind == dtrain::init_kind::zeros));
  // saved: q, k, v (heads layout), probabilities, merged heads; + q and k before QK-norm
  const SeqShape s{2, 5};
  BOOST_TEST(cross.saved_size(s, 9) == 2 * 10 * 16 + 2 * 18 * 16 + 2 * 4 * 5 * 9);
  BOOST_TEST(qk.saved_size(s, 16) == 4 * 10 * 16 + 2 * 4 * 5 * 5 + 10 * 16 + 10 * 16);
}

// A device the host cannot read (the GPU) runs the bidirectional, cross and
// QK-norm forms only with DTRAIN_GPU_ATTENTION=on (nn/checks.hpp).
BOOST_AUTO_TEST_CASE(gpu_switch) {
  const auto says = [](const std::string& text) {
    return [text](const dtrain::config_error& e) { return std::string(e.what()).find(text) != std::string::npos; };
  };
  ::unsetenv("DTRAIN_GPU_ATTENTION");
  BOOST_CHECK_EXCEPTION(nn::detail::require_gpu_switch("nn::Attention", "DTRAIN_GPU_ATTENTION"), dtrain::config_error,
                        says("set DTRAIN_GPU_ATTENTION=on"));
  ::setenv("DTRAIN_GPU_ATTENTION", "maybe", 1);
  BOOST_CHECK_EXCEPTION(nn::detail::require_gpu_switch("nn::Attention", "DTRAIN_GPU_ATTENTION"), dtrain::config_error,
                        says("is not one of off|on"));
  ::setenv("DTRAIN_GPU_ATTENTION", "on", 1);
  BOOST_CHECK_NO_THROW(nn::detail::require_gpu_switch("nn::Attention", "DTRAIN_GPU_ATTENTION"));
  ::unsetenv("DTRAIN_GPU_ATTENTION");
}

BOOST_AUTO_TEST_SUITE_END()
