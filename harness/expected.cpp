#include "harness/expected.hpp"

#include <algorithm>   // std::sort, std::find
#include <filesystem>  // std::filesystem
#include <system_error>  // std::error_code

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/result.hpp"  // read_json_file

#ifndef STALLBENCH_SOURCE_DIR
#define STALLBENCH_SOURCE_DIR ""
#endif
#ifndef STALLBENCH_INSTALL_DATADIR
#define STALLBENCH_INSTALL_DATADIR ""
#endif

namespace fs = std::filesystem;

namespace sb {

using json = nlohmann::ordered_json;

std::string ExpectedFile::id() const { return doc.value("/hardware/id"_json_pointer, std::string("?")); }

std::optional<std::pair<double, std::string>> ExpectedFile::peak_tflops(DType t) const {
  const auto ptr = json::json_pointer("/peaks/tflops/" + std::string(to_string(t)));
  if (!doc.contains(ptr)) return std::nullopt;
  const json& p = doc.at(ptr);
  if (!p.contains("value") || !p["value"].is_number()) return std::nullopt;
  return std::make_pair(p["value"].get<double>(),
                        fmt::format("{} ({})", p.value("source", "?"), p.value("kind", "?")));
}

bool where_matches(const json& where, const json& params) {
  if (!where.is_object()) return true;
  for (const auto& [k, v] : where.items())
    if (!params.contains(k) || params.at(k) != v) return false;
  return true;
}

std::vector<json> ExpectedFile::figures_for(const std::string& scenario, const std::string& metric,
                                            const json& params) const {
  // Only the most specific matches count: a figure for {dtype, size} says
  // more about a size-8192 point than a figure for {dtype} over all shapes.
  std::vector<json> out;
  std::size_t best = 0;
  for (const auto& f : doc.value("figures", json::array())) {
    const json where = f.value("where", json::object());
    if (f.value("scenario", "") != scenario || f.value("metric", "") != metric || !where_matches(where, params))
      continue;
    if (where.size() > best) {
      out.clear();
      best = where.size();
    }
    if (where.size() == best) out.push_back(f);
  }
  return out;
}

bool is_expected_doc(const json& doc) {
  return doc.is_object() && doc.value("kind", "") == "expected" && doc.contains("hardware");
}

std::vector<std::string> expected_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("STALLBENCH_DATA_DIR"); env && *env)
    dirs.push_back((fs::path(env) / "expected").string());
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path().parent_path() / "share" / "stallbench" / "expected").string());
  if (*STALLBENCH_INSTALL_DATADIR) dirs.push_back((fs::path(STALLBENCH_INSTALL_DATADIR) / "expected").string());
  if (*STALLBENCH_SOURCE_DIR) dirs.push_back((fs::path(STALLBENCH_SOURCE_DIR) / "results" / "expected").string());
  return dirs;
}

ExpectedFile load_expected_file(const std::string& path) {
  ExpectedFile f{path, read_json_file(path)};
  if (!is_expected_doc(f.doc))
    throw UsageError(fmt::format("{} is not an expected-numbers file (no \"kind\": \"expected\")", path));
  return f;
}

std::vector<ExpectedFile> load_expected_files() {
  for (const auto& d : expected_dirs()) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<std::string> paths;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".json") paths.push_back(e.path().string());
    if (paths.empty()) continue;
    std::sort(paths.begin(), paths.end());
    std::vector<ExpectedFile> files;
    for (const auto& p : paths) files.push_back(load_expected_file(p));
    return files;
  }
  return {};
}

std::optional<ExpectedFile> match_expected(const DeviceInfo& dev, const std::vector<std::string>& cpu_isa,
                                           int logical_cores) {
  for (auto& f : load_expected_files()) {
    const json& hw = f.doc["hardware"];
    const json match = hw.value("match", json::object());
    const std::string cls = hw.value("class", "gpu");
    if (dev.kind == DeviceKind::cpu) {
      if (cls != "cpu") continue;
      bool ok = true;
      for (const auto& isa : match.value("isa", json::array()))
        ok = ok && std::find(cpu_isa.begin(), cpu_isa.end(), isa.get<std::string>()) != cpu_isa.end();
      for (const auto& isa : match.value("isa_absent", json::array()))
        ok = ok && std::find(cpu_isa.begin(), cpu_isa.end(), isa.get<std::string>()) == cpu_isa.end();
      if (match.contains("logical_cores")) ok = ok && match["logical_cores"].get<int>() == logical_cores;
      if (ok) return f;
    } else if (dev.kind == DeviceKind::sim) {
      // A simulated device is made from one expected file: that one.
      if (dev.props.value("hardware_id", "") == hw.value("id", "")) return f;
    } else {
      if (cls != "gpu") continue;
      for (const auto& s : match.value("name_contains", json::array()))
        if (dev.name.find(s.get<std::string>()) != std::string::npos) return f;
    }
  }
  return std::nullopt;
}

}  // namespace sb
