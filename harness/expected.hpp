// Expected numbers per hardware (results/expected/*.json): datasheet peaks and
// published or measured achievable figures, each with its source and kind.
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/device.hpp"  // DeviceInfo
#include "harness/dtype.hpp"   // DType

namespace sb {

struct ExpectedFile {
  std::string path;
  nlohmann::ordered_json doc;
  std::string id() const;  // hardware.id
  // Datasheet peak TFLOP/s for a dtype, with its source; nullopt if absent.
  std::optional<std::pair<double, std::string>> peak_tflops(DType) const;
  // The file's figures for a scenario and metric whose `where` is a subset
  // of params; of those, only the ones with the most `where` keys.
  std::vector<nlohmann::ordered_json> figures_for(const std::string& scenario, const std::string& metric,
                                                   const nlohmann::ordered_json& params) const;
};

// Directories searched, in order: $STALLBENCH_DATA_DIR/expected, the install
// location next to the binary (<exe>/../share/stallbench/expected), the
// configured install prefix, and the source tree the binary was built from.
std::vector<std::string> expected_dirs();

// All expected files found in the first directory that has any.
std::vector<ExpectedFile> load_expected_files();

// Throws UsageError if the file is unreadable or not an expected file.
ExpectedFile load_expected_file(const std::string& path);

// The expected file whose hardware.match selects this device; cpu info
// needs the host's ISA flags and core count (from fingerprint).
std::optional<ExpectedFile> match_expected(const DeviceInfo& dev, const std::vector<std::string>& cpu_isa,
                                           int logical_cores);

bool is_expected_doc(const nlohmann::ordered_json& doc);
bool where_matches(const nlohmann::ordered_json& where, const nlohmann::ordered_json& params);

}  // namespace sb
