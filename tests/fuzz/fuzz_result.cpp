// The result reader, as `stallbench compare A B` uses it: the file's bytes
// parsed (parse_json_text, behind read_json_file), checked into a Result
// (result_from_json), then compared with itself and with an expected file,
// and the report formatted.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include "harness/compare.hpp"    // compare_docs, format_compare
#include "harness/json_read.hpp"  // parse_json_text
#include "harness/result.hpp"     // result_from_json, to_json
#include "tests/fuzz/fuzz_common.hpp"

namespace {

using json = nlohmann::ordered_json;

const json& expected_doc() {
  static const json doc = json::parse(R"({
    "schema_version": 1, "kind": "expected",
    "hardware": {"id": "h100-sxm", "name": "H100", "class": "gpu", "match": {"name_contains": ["H100"]}},
    "peaks": {"tflops": {"bf16": {"value": 989.4, "unit": "TFLOP/s", "kind": "datasheet", "source": "sheet"},
                         "fp32": {"value": 67, "unit": "TFLOP/s", "kind": "datasheet", "source": "sheet"}}},
    "figures": [
      {"scenario": "precision", "metric": "tflops", "where": {"dtype": "bf16"}, "value": 700,
       "unit": "TFLOP/s", "direction": "higher", "kind": "published", "source": "generic"},
      {"scenario": "precision", "metric": "tflops", "where": {"dtype": "bf16", "size": 8192}, "value": 769,
       "unit": "TFLOP/s", "direction": "higher", "kind": "measured", "source": "same machine"},
      {"scenario": "precision", "metric": "ms", "where": {"dtype": "fp32"}, "value": 2,
       "unit": "us", "direction": "lower", "kind": "measured", "source": "other unit"}]})");
  return doc;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-result.json";
  sb::fuzz::usage_errors_only(file, [&] {
    const json doc = sb::parse_json_text(sb::fuzz::as_text(data, size), file);
    const sb::Result r = sb::result_from_json(doc, file);
    // What was read is a result: written back, it reads again.
    sb::fuzz::require(sb::to_json(sb::result_from_json(sb::to_json(r), "round trip")) == sb::to_json(r),
                      "a result read, written and read again is the same");
    (void)sb::format_compare(sb::compare_docs(doc, doc, 0.05, file, file));
    (void)sb::format_compare(sb::compare_docs(doc, expected_doc(), 0.05, file, "h100-sxm.json"));
  });
  return 0;
}
