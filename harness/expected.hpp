// Expected numbers per hardware (results/expected/*.json): datasheet peaks and
// published or measured achievable figures, each with its source and kind.
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/device.hpp"  // DeviceInfo
#include "harness/dtype.hpp"   // DType
#include "harness/fingerprint.hpp"  // CpuInfo

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

// All expected files found in the first directory that has any. A bad file
// there (not JSON, a field of the wrong type) is skipped with one warning
// line on stderr naming the file and the field; the run goes on with the others.
std::vector<ExpectedFile> load_expected_files();

// The *.json files of dir, in name order; a bad one is left out and its
// reason appended to skipped ("skipped expected-numbers file <path>: <why>").
std::vector<ExpectedFile> load_expected_dir(const std::string& dir, std::vector<std::string>& skipped);

// Throws UsageError if the file is unreadable or not an expected file; the
// message names the file and the path of a missing or mistyped field.
ExpectedFile load_expected_file(const std::string& path);

// An expected-numbers document, checked: every field a reader uses has its
// type (results/schema/expected.schema.json), so the accessors above never
// meet a surprise. Throws UsageError naming `file` and the field's path.
ExpectedFile expected_from_json(nlohmann::ordered_json doc, const std::string& file);

// Whether a checked file's hardware.match selects this device. A cpu file
// matches on the host's ISA flags, core count, and (when it names them) the
// CPU's vendor and family (read_cpu_info).
bool expected_matches(const ExpectedFile& f, const DeviceInfo& dev, const CpuInfo& cpu);
// The same test, saying why not: "" when the file matches, else the first reason it does not
// ("cpu-spr-amx-2c needs amx_bf16, which the cpu lacks").
std::string expected_mismatch(const ExpectedFile& f, const DeviceInfo& dev, const CpuInfo& cpu);

// The first expected file (load_expected_files) that matches this device.
std::optional<ExpectedFile> match_expected(const DeviceInfo& dev, const CpuInfo& cpu);

bool where_matches(const nlohmann::ordered_json& where, const nlohmann::ordered_json& params);

}  // namespace sb
