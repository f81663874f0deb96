// The training-config reader of `stallbench diagnose --config FILE`: the
// bytes parsed as an Axolotl-style YAML config (libyaml, then every key
// read and checked), then written back as the report's JSON.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include "diagnose/config.hpp"  // parse_axolotl_yaml_text, to_json
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-config.yml";
  sb::fuzz::usage_errors_only(file, [&] {
    const auto cfg = sb::diagnose::parse_axolotl_yaml_text(std::string(sb::fuzz::as_text(data, size)), file);
    sb::fuzz::require(cfg.micro_batch_size >= 1 && cfg.sequence_len >= 1, "counts are positive");
    sb::fuzz::require(cfg.model.hidden_size % cfg.model.num_attention_heads == 0, "heads divide hidden_size");
    sb::fuzz::require(!(cfg.bf16 && cfg.fp16), "not bf16 and fp16 at once");
    (void)sb::diagnose::to_json(cfg).dump();
  });
  return 0;
}
