// dtrain-estimate --hf-config over diffusers configs (bench/hf/sd15-unet.json,
// sdxl-unet.json: Stable Diffusion 1.5's and SDXL base's UNets): the
// parameters it builds against the counts diffusers and PEFT report for
// those models (SD 1.5 859,520,964; SDXL 2,567,463,684; rank-16 adapters
// on to_q,to_k,to_v,to_out.0 of SD 1.5: 3,188,736 trainable), a row per
// strategy with activations, LoRA's frozen weights counted as parameters,
// and the usage errors (exit 2).
#define BOOST_TEST_MODULE tools_estimate_diffusion
#include <string>

#include <boost/test/unit_test.hpp>
#include <tools/estimate_cli.hpp>

using dtrain::testing::run_cli;

namespace {

const std::string sd15 = std::string(DTRAIN_SOURCE_DIR) + "/bench/hf/sd15-unet.json";
const std::string sdxl = std::string(DTRAIN_SOURCE_DIR) + "/bench/hf/sdxl-unet.json";

bool says(const std::string& out, const std::string& what) { return out.find(what) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(unet_parameters_are_diffusers_counts) {
  const auto [status, out] = run_cli("--hf-config " + sd15 + " --world 1,2 --strategy ddp,fsdp-full --batch-size 1");
  BOOST_TEST_REQUIRE(status == 0, out);
  BOOST_TEST(says(out, "859,520,964 parameters in 75 units"), out);
  BOOST_TEST(says(out, "latents 4 x 64 x 64, text 77 x 768"), out);
  BOOST_TEST(says(out, "| 2     | fsdp-full"), out);
  const auto [xl_status, xl] = run_cli("--hf-config " + sdxl + " --precision bf16 --activation-checkpointing");
  BOOST_TEST_REQUIRE(xl_status == 0, xl);
  BOOST_TEST(says(xl, "2,567,463,684 parameters"), xl);
  BOOST_TEST(says(xl, "SDXL text_time"), xl);
}

BOOST_AUTO_TEST_CASE(unet_lora_trains_peft_count) {
  const auto [status, out] = run_cli(
      "--hf-config " + sd15 + " --batch-size 4 --precision bf16 --lora-r 16 --lora-targets to_q,to_k,to_v,to_out.0");
  BOOST_TEST_REQUIRE(status == 0, out);
  BOOST_TEST(says(out, "(3,188,736 trainable)"), out);
  BOOST_TEST(says(out, "LoRA r=16"), out);
}

BOOST_AUTO_TEST_CASE(usage_errors_exit_2) {
  BOOST_TEST(run_cli("--hf-config " + sd15 + " --train all").first == 2);
  const auto [status, out] = run_cli("--hf-config " + sd15 + " --lora-r 4 --lora-targets conv1");
  BOOST_TEST(status == 2, out);
  BOOST_TEST(says(out, "matches no projection dtrain adapts"), out);
}
